"""The EAGLE-3 draft model: one decoder layer over fused target features.
(docs/eagle3.md#the-draft-model; the TTT unroll: docs/eagle3.md#the-ttt-loss)

Public API
----------
Eagle3Config, PRESETS, preset(name), default_aux_layer_ids(n)   (engine/model/config.py,
    engine/model/presets.py; RMSNorm and RoPE live in engine/model/blocks.py)
    The typed config; engine/ckpt/config_styles.py reads it from and writes it to the EAGLE
    (flat Llama) and the speculators config style. Presets: "tiny" (CPU tests), "llama3-8b",
    "kimi-k2", "kimi-k2-mla", "tiny-mla".
Eagle3Draft(cfg)
    The nn.Module. Canonical parameter names are the EAGLE ones (engine/ckpt/key_map.py maps the
    speculators `layers.0.*` names to and from them):
        embed_tokens.weight                 [V, H]    frozen (requires_grad False), from the target
        fc.weight                           [H, 3Ht]
        midlayer.hidden_norm.weight         [H]
        midlayer.input_layernorm.weight     [H]
        midlayer.self_attn.q_proj.weight    [nh*hd, 2H]
        midlayer.self_attn.k_proj.weight    [nkv*hd, 2H]   (v_proj the same)
        midlayer.self_attn.o_proj.weight    [H, nh*hd]
        midlayer.post_attention_layernorm.weight  [H]
        midlayer.mlp.gate_proj.weight       [I, H]         (up_proj the same, down_proj [H, I])
        norm.weight                         [H]
        lm_head.weight                      [Vd, H]
        d2t (buffer)                        int64 [Vd]  target_id = draft_id + d2t[draft_id]
        t2d (buffer)                        bool  [V]   true for target ids in the draft vocab
    Optional, by config flag: input_norm.weight [3Ht] (norm_before_fc), fc_norm.{0,1,2}.weight
    [Ht] (fc_norm). An MLA drafter (`cfg.layer_kind == "mla"`) has the MLA attention's
    parameters instead of q/k/v/o_proj (engine/model/mla_layer.py); the rest is the same.
    Rotary tables are non-persistent buffers, never saved. `norm_output` (EAGLE 3.1):
    the state handed to the next step is norm(out), not out.
    `trainable_state_dict()` is the state dict without the frozen embedding; `set_embedding(w)`
    installs the target's (engine/ckpt/target_weights.py `load_target_embedding` reads it from a
    target dir).
Eagle3Draft.ttt_forward(aux_hidden [B,T,3Ht], input_ids [B,T], steps K,
                        attention_mask [B,T] | None, position_ids [B,T] | None,
                        rows: K index tensors | None, head: bool)
    -> list of K draft-vocab logits [B,T,Vd]. The training-time-test unroll. head=False returns
    the lm_head's input (the final-norm states [.., H]) for the trainer's fused loss.
    With `rows`, step i's logits are only those of the flat positions rows[i] (indices into
    B*T): [n_i, Vd]. The trainer passes the positions its loss reads, so the norm, the lm_head
    and the loss skip the others (prompt tokens, padding, targets outside the draft vocab).
    Inputs are UNSHIFTED: aux_hidden[:, t] is the target's state after token t and input_ids[:, t]
    is token t. THE MODEL SHIFTS: step i at position t embeds token t+1+i (positions past the end
    embed token 0 and are garbage), so logits[i][:, t] predicts token t+2+i. The matching target
    distribution is the target's logits at position t+1+i, i.e. `shift_left(target_logits, 1+i)`;
    the caller masks positions with t+1+i >= T (`valid_positions(T, i)`), and shifts its loss mask
    the same way (`shift_left(loss_mask, 2+i)` marks assistant tokens being predicted).
    Attention at step i: query t sees step-0 keys at positions <= t, plus the key of every step
    j = 1..i at the same position t; one softmax. RoPE position of step i is t+i. It runs without
    a dense mask (engine/model/ttt_attention.py: causal flash attention + diagonal scores, merged by
    log-sum-exp); `attn_impl = "dense"` selects the masked-SDPA reference over all (i+1)T keys,
    which is also taken for padding other than right padding. With right padding, padded
    positions' logits differ between the two (garbage either way); real positions agree.
Eagle3Draft.draft_greedy(aux_hidden [B,T,3Ht], input_ids [B,T+1], k) -> [B,k] TARGET ids.
    A greedy chain as a serving engine runs it: position t gets h_t and token t+1, so input_ids
    carries one more token than aux_hidden (token T is the target's newest token, the one sampled
    from its logits at T-1). Returns the drafts for tokens T+1 .. T+k, mapped through d2t.
Eagle3Draft.logits(out [.., H]) -> [.., Vd]  and  Eagle3Draft.to_target_ids(draft_ids).
shift_left(x, n, fill=0), valid_positions(T, i): helpers for the trainer's targets and masks.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.model.blocks import KV, RMSNorm, apply_rope, inv_freq, rope_cos_sin
from engine.model.config import Eagle3Config, default_aux_layer_ids
from engine.model.mla_layer import MLAttention
from engine.model.packing import Spans, block_diagonal, segment_positions, segment_spans
from engine.model.presets import PRESETS, preset
from engine.model.ttt_attention import split_attention

__all__ = ["Eagle3Config", "Eagle3Draft", "PRESETS", "default_aux_layer_ids", "inv_freq",
           "preset", "shift_left", "valid_positions"]


# -- the decoder layer -----------------------------------------------------------------------------


class Attention(nn.Module):
    """Grouped-query attention whose q/k/v read the 2H-wide [embedding, hidden] input.

    The input is taken in its two halves: `embed_part(e)` is what the (normalised) embedding
    half contributes to q/k/v, `forward(ep, hn, ...)` adds the hidden half's. The sum is the
    projection of the concatenated input; the split lets training compute the embedding part of
    each token once for all its TTT steps (the embedding is frozen, so it needs no gradient)."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        assert cfg.head_dim is not None and cfg.num_key_value_heads is not None
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        h2 = 2 * cfg.hidden_size
        self.q_proj = nn.Linear(h2, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(h2, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(h2, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, cfg.hidden_size, bias=False)

    def embed_part(self, e: Tensor) -> Tensor:
        """e [B,T,H] (the normalised embedding) -> its part of q, k, v [B,T,(nh+2nkv)hd]."""
        h = e.shape[-1]  # the embedding columns are views of the weights (nothing copied)
        return torch.cat([F.linear(e, p.weight[:, :h])
                          for p in (self.q_proj, self.k_proj, self.v_proj)], dim=-1)

    def forward(self, ep: Tensor, hn: Tensor, cos: Tensor, sin: Tensor, past: list[KV],
                mask: Tensor | Spans | None, causal: bool = True) -> tuple[Tensor, KV]:
        """ep [B,T,(nh+2nkv)hd] (`embed_part`), hn [B,T,H] the normalised hidden; past: earlier
        steps' (k, v), read only. Returns (out [B,T,H], this step's (k, v)); the caller appends
        it to `past` for the next step.

        mask None: the TTT structure without a mask (engine/model/ttt_attention.py): past[0] (or
        this step's keys at step 0) are the step-0 keys, causal (all of them when not `causal`), the
        later steps' keys are seen at the query's own position; `Spans` (packed rows): the same,
        the step-0 keys of the query's own sample only. Otherwise `mask` [B|1,1,T,S] is a bool
        mask over the concatenated keys (past in order, then this step's): the dense path."""
        b, t, h = hn.shape
        eq, ek, ev = ep.split((self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd), -1)
        # the hidden columns are views of the weights: nothing copied, nothing extra kept
        q = (eq + F.linear(hn, self.q_proj.weight[:, h:])).view(b, t, self.nh, self.hd)
        k = (ek + F.linear(hn, self.k_proj.weight[:, h:])).view(b, t, self.nkv, self.hd)
        v = (ev + F.linear(hn, self.v_proj.weight[:, h:])).view(b, t, self.nkv, self.hd)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B,n,T,hd]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if not isinstance(mask, Tensor):
            k0, v0 = past[0] if past else (k, v)
            diag = [*past[1:], (k, v)] if past else []
            out = split_attention(q, k0, v0, diag, causal, spans=mask)  # [B,nh,T,hd]
        else:
            keys = torch.cat([kv[0] for kv in past] + [k], dim=2)  # [B,nkv,S,hd]
            vals = torch.cat([kv[1] for kv in past] + [v], dim=2)  # [B,nkv,S,hd]
            rep = self.nh // self.nkv
            if rep > 1:
                keys = keys.repeat_interleave(rep, dim=1)  # [B,nh,S,hd]
                vals = vals.repeat_interleave(rep, dim=1)
            out = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask)  # [B,nh,T,hd]
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.nh * self.hd)), (k, v)


class MLP(nn.Module):
    """SiLU-gated MLP: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _attention(cfg: Eagle3Config) -> Attention | MLAttention:
    """The layer kind's attention: this file's grouped-query one, or MLA (its own file)."""
    return MLAttention(cfg) if cfg.layer_kind == "mla" else Attention(cfg)


class DecoderLayer(nn.Module):
    """The single EAGLE-3 layer: its attention reads [embedding; fused features] (2H wide).
    The attention is the layer kind's (`_attention`); norms, residual and MLP are the same."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        eps = cfg.rms_norm_eps
        self.norm_before_residual = cfg.norm_before_residual
        self.hidden_norm = RMSNorm(cfg.hidden_size, eps)
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.self_attn = _attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.mlp = MLP(cfg)

    def embed_proj(self, emb: Tensor) -> Tensor:
        """emb [B,T,H] -> its part of q, k, v: input_layernorm, then the embedding half (the
        FIRST H columns) of q/k/v (Attention.embed_part)."""
        return self.self_attn.embed_part(self.input_layernorm(emb))

    def forward(self, ep: Tensor, h: Tensor, cos: Tensor, sin: Tensor, past: list[KV],
                mask: Tensor | Spans | None, causal: bool = True) -> tuple[Tensor, KV]:
        """ep (`embed_proj` of the input tokens), h [B,T,H] -> (out [B,T,H] (pre-final-norm;
        the next step's h), this step's (k, v)); `past` is read only (Attention.forward)."""
        hn = self.hidden_norm(h)
        residual = hn if self.norm_before_residual else h  # EAGLE math: un-normalised h
        a, kv = self.self_attn(ep, hn, cos, sin, past, mask, causal)
        h1 = residual + a
        return h1 + self.mlp(self.post_attention_layernorm(h1)), kv


# -- the draft model -------------------------------------------------------------------------------

class Eagle3Draft(nn.Module):
    """EAGLE-3 drafter: fc over 3 aux target states, one decoder layer, norm, draft-vocab head."""

    # registered buffers (below), declared so the type checker knows them as tensors
    d2t: Tensor
    t2d: Tensor
    inv_freq: Tensor

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.config = cfg
        H, Ht = cfg.hidden_size, cfg.target_hidden_size
        V, Vd = cfg.vocab_size, cfg.draft_vocab_size
        assert Ht is not None and Vd is not None
        self.embed_tokens = nn.Embedding(V, H)
        self.embed_tokens.weight.requires_grad_(False)  # frozen: it is the target's embedding
        if cfg.norm_before_fc:
            self.input_norm = RMSNorm(3 * Ht, cfg.rms_norm_eps)
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(Ht, cfg.rms_norm_eps) for _ in range(3))
        self.fc = nn.Linear(3 * Ht, H, bias=False)
        self.midlayer = DecoderLayer(cfg)
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, Vd, bias=False)
        # Identity map by default: draft id i is target id i.
        self.register_buffer("d2t", torch.zeros(Vd, dtype=torch.int64))
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[:Vd] = True
        self.register_buffer("t2d", t2d)
        freqs, scale = inv_freq(cfg)
        self.register_buffer("inv_freq", freqs, persistent=False)
        self.rope_scale = scale
        self.attn_impl = "split"
        """"split" (engine/model/ttt_attention.py, no dense mask) or "dense" (the masked-SDPA
        reference over all (i+1)T keys); both compute the same attention."""
        self.checkpoint_activations = False
        """Recompute each TTT step's decoder layer in the backward (torch.utils.checkpoint)
        instead of keeping its activations: K layers' intermediates become K layer outputs."""
        self._step_fn: Any = None  # torch.compile'd `_ttt_step` (compile_step)

    # -- pieces --------------------------------------------------------------------------------
    def fuse(self, aux_hidden: Tensor) -> Tensor:
        """aux_hidden [B,T,3Ht] (low, mid, high) -> h [B,T,H]."""
        if self.config.norm_before_fc:
            aux_hidden = self.input_norm(aux_hidden)
        if self.config.fc_norm:
            parts = zip(self.fc_norm, aux_hidden.chunk(3, -1), strict=True)
            aux_hidden = torch.cat([n(c) for n, c in parts],
                                   dim=-1)
        return self.fc(aux_hidden.to(self.fc.weight.dtype))

    def logits(self, out: Tensor) -> Tensor:
        """Pre-norm hidden [..., H] -> draft-vocab logits [..., Vd]."""
        return self.lm_head(self.norm(out))

    def hand_on(self, out: Tensor) -> Tensor:
        """The layer's pre-norm output -> the state the next draft step receives: the same, or
        with `norm_output` (EAGLE 3.1) the final norm of it. Logits are `logits(out)`
        either way (lm_head of the normalised state)."""
        return self.norm(out) if self.config.norm_output else out

    def to_target_ids(self, draft_ids: Tensor) -> Tensor:
        """Draft ids -> target ids through the d2t offsets."""
        return draft_ids + self.d2t[draft_ids]

    @torch.no_grad()
    def set_embedding(self, weight: Tensor) -> None:
        """Install the target's embedding [V, H] (stays frozen)."""
        if tuple(weight.shape) != tuple(self.embed_tokens.weight.shape):
            want = list(self.embed_tokens.weight.shape)
            raise ValueError(f"embedding {list(weight.shape)} != {want}")
        self.embed_tokens.weight.copy_(weight)

    def trainable_state_dict(self) -> dict[str, Tensor]:
        """The state dict without the frozen embedding (what an EAGLE checkpoint holds)."""
        return {k: v for k, v in self.state_dict().items() if k != "embed_tokens.weight"}

    def _cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        return rope_cos_sin(positions, self.inv_freq, self.rope_scale, dtype)

    # -- training-time test --------------------------------------------------------------------
    def ttt_forward(self, aux_hidden: Tensor, input_ids: Tensor, steps: int,
                    attention_mask: Tensor | None = None,
                    position_ids: Tensor | None = None,
                    rows: list[Tensor] | None = None, head: bool = True,
                    segments: Tensor | None = None) -> list[Tensor]:
        """The K-step TTT unroll (module docstring): returns K logits tensors [B,T,Vd], or
        [n_i,Vd] for the flat positions rows[i] when `rows` is given. head=False: the lm_head's
        input instead ([.., H], the final-norm states), for a loss that applies the lm_head
        itself (engine/model/fused_ce.py). `segments` [B,T]: packed rows (engine/model/
        packing.py), attention block-diagonal per sample, positions restarting."""
        if steps < 1:
            raise ValueError("steps must be >= 1")
        b, t, _ = aux_hidden.shape
        dev = aux_hidden.device
        if position_ids is None:
            position_ids = torch.arange(t, device=dev).expand(b, t) if segments is None \
                else segment_positions(segments)  # [B,T]
        h = self.fuse(aux_hidden)  # [B,T,H]
        split = self._split(attention_mask)
        # packed rows: the step-0 keys per sample (split), or a block-diagonal dense mask
        spans = segment_spans(segments) if split and segments is not None else None
        # Every step reads the same tokens, shifted: token t+1's part of q/k/v is computed once
        # (one matmul, one weight gradient) and shifted left by i for step i, instead of K times.
        emb = self.embed_tokens(shift_left(input_ids, 1)).to(h.dtype)  # [B,T,H], 0 at the end
        ep_all = self.midlayer.embed_proj(emb)  # [B,T,(nh+2nkv)hd]
        past: list[KV] = []
        out_logits: list[Tensor] = []
        for i in range(steps):
            ep = _shift_repeat_last(ep_all, i)  # token t+1+i (token 0's part past the end)
            cos, sin = self._cos_sin(position_ids + i, h.dtype)
            mask = spans if split else ttt_mask(t, i, attention_mask, dev,  # [B|1,1,T,(i+1)T]
                                                segments)
            step = self._step_fn or self._ttt_step
            h, lg, kv = step(ep, h, cos, sin, past, mask,  # h [B,T,H], fed to step i+1
                             None if rows is None else rows[i], head)
            past.append(kv)
            out_logits.append(lg)  # [B,T,Vd]
        return out_logits

    def _ttt_step(self, ep: Tensor, h: Tensor, cos: Tensor, sin: Tensor, past: list[KV],
                  mask: Tensor | Spans | None, rows: Tensor | None = None, head: bool = True
                  ) -> tuple[Tensor, Tensor, KV]:
        """One TTT step (ep: the step's tokens' `embed_proj`): (the next step's h [B,T,H] (pre-
        final-norm, or after it with `norm_output`), logits [B,T,Vd] or [n,Vd] of the flat
        `rows` (without `head`: the final-norm states there), this step's (k, v))."""
        if self.checkpoint_activations and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint
            out, kv = checkpoint(self.midlayer, ep, h, cos, sin, list(past), mask,  # a snapshot:
                                 use_reentrant=False)  # the caller appends to `past`
        else:
            out, kv = self.midlayer(ep, h, cos, sin, past, mask)
        if self.config.norm_output:  # EAGLE 3.1: the normalised state goes on, logits from it
            out = self.norm(out)
            sel = out if rows is None else out.reshape(-1, out.shape[-1]).index_select(0, rows)
        else:
            sel = out if rows is None else out.reshape(-1, out.shape[-1]).index_select(0, rows)
            sel = self.norm(sel)
        return out, self.lm_head(sel) if head else sel, kv

    def compile_step(self, **options: Any) -> None:
        """torch.compile the TTT step (`_ttt_step`; CPU and CUDA). One graph per step index
        (the number of earlier steps' keys differs), shapes dynamic from the start (batches vary
        in length: one compile per step index, not one per length)."""
        import torch._dynamo
        cfg = torch._dynamo.config
        name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
        setattr(cfg, name, max(64, int(getattr(cfg, name))))
        self._step_fn = torch.compile(self._ttt_step, **{"dynamic": True, **options})

    def _split(self, attention_mask: Tensor | None) -> bool:
        """Whether the unmasked split attention computes what `ttt_mask` would: always without
        padding; with RIGHT padding too at every real position (a padded key is only ever seen
        by padded queries, whose outputs nobody reads), not with other padding."""
        if self.attn_impl != "split":
            return False
        if attention_mask is None:
            return True
        m = attention_mask.bool()
        return bool((m[:, 1:] <= m[:, :-1]).all())

    # -- greedy chain for evaluation -------------------------------------------------------------
    def _step0(self, aux_hidden: Tensor, input_ids: Tensor, past: list[KV],
               attention_mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """The causal step-0 pass of a greedy chain: (out [B,T,H], positions [B,T]); fills
        `past` with the step-0 keys. Token p+1 sits at position p."""
        b, t, _ = aux_hidden.shape
        if input_ids.shape[1] != t + 1:
            raise ValueError(f"input_ids must have T+1={t + 1} tokens (got {input_ids.shape[1]})")
        dev = aux_hidden.device
        h = self.fuse(aux_hidden)  # [B,T,H]
        pos = torch.arange(t, device=dev).expand(b, t)  # [B,T]
        emb = self.embed_tokens(input_ids[:, 1:]).to(h.dtype)
        cos, sin = self._cos_sin(pos, h.dtype)
        # Padded rows keep the dense mask: draft_greedy reads the LAST position, a pad there.
        mask = None if attention_mask is None and self.attn_impl == "split" else \
            ttt_mask(t, 0, attention_mask, dev)
        out, kv = self.midlayer(self.midlayer.embed_proj(emb), h, cos, sin, past, mask)
        past.append(kv)
        return out, pos

    @torch.no_grad()
    def draft_greedy(self, aux_hidden: Tensor, input_ids: Tensor, k: int,
                     attention_mask: Tensor | None = None) -> Tensor:
        """k greedy drafts [B,k] in TARGET ids after the prefix (module docstring)."""
        b, t, _ = aux_hidden.shape
        dev = aux_hidden.device
        past: list[KV] = []
        out, _ = self._step0(aux_hidden, input_ids, past, attention_mask)
        last = out[:, -1:]  # [B,1,H]
        dtype = out.dtype
        drafts: list[Tensor] = []
        for i in range(k):
            tok = self.to_target_ids(self.logits(last).argmax(-1))  # [B,1] target ids
            drafts.append(tok)
            if i == k - 1:
                break
            # Step i+1 at position T-1: sees all step-0 keys and its own earlier steps' keys.
            emb = self.embed_tokens(tok).to(dtype)  # [B,1,H]
            cos, sin = self._cos_sin(torch.full((b, 1), t - 1 + i + 1, device=dev), dtype)
            if attention_mask is None and self.attn_impl == "split":
                keep = None  # the split attention, every step-0 key visible (not causal)
            else:
                keep = torch.ones(1, 1, 1, t + i + 1, dtype=torch.bool, device=dev)
                if attention_mask is not None:
                    keep = torch.cat([attention_mask.bool()[:, None, None, :],
                                      keep[..., t:].expand(b, 1, 1, i + 1)], dim=-1)
            last, kv = self.midlayer(self.midlayer.embed_proj(emb), self.hand_on(last), cos, sin,
                                     past, keep, causal=False)
            past.append(kv)
        return torch.cat(drafts, dim=1)  # [B,k]

    @torch.no_grad()
    def draft_greedy_all(self, aux_hidden: Tensor, input_ids: Tensor, k: int) -> Tensor:
        """`draft_greedy` from every prefix at once: [B,T,k] target ids, row p = the k drafts
        after the prefix aux[:, :p+1], input_ids[:, :p+2] (what `draft_greedy` returns for it).

        One causal step-0 pass over all T positions, then k-1 steps whose queries see the step-0
        keys up to their own position and their own earlier steps' keys: the TTT mask
        (`ttt_mask`), with the draft's own argmax tokens as inputs instead of the text's. Causal
        attention makes every row equal to its prefix's `draft_greedy`; right padding only adds
        rows nobody reads."""
        t = aux_hidden.shape[1]
        dev = aux_hidden.device
        past: list[KV] = []
        last, pos = self._step0(aux_hidden, input_ids, past, None)  # [B,T,H]
        dtype = last.dtype
        drafts: list[Tensor] = []
        for i in range(k):
            tok = self.to_target_ids(self.logits(last).argmax(-1))  # [B,T] target ids
            drafts.append(tok)
            if i == k - 1:
                break
            emb = self.embed_tokens(tok).to(dtype)  # [B,T,H]: row p's draft i at p+i+1
            cos, sin = self._cos_sin(pos + i + 1, dtype)
            mask = None if self.attn_impl == "split" else ttt_mask(t, i + 1, None, dev)
            last, kv = self.midlayer(self.midlayer.embed_proj(emb), self.hand_on(last), cos, sin,
                                     past, mask)
            past.append(kv)
        return torch.stack(drafts, dim=-1)  # [B,T,k]


def ttt_mask(t: int, i: int, attention_mask: Tensor | None, device: torch.device,
             segments: Tensor | None = None) -> Tensor:
    """Bool mask [B|1,1,T,(i+1)T] for TTT step i: causal over step-0 keys (within a query's own
    segment when `segments` [B,T] is given), then one diagonal block per step j = 1..i (the key
    of step j at the query's own position)."""
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()  # [T,T]
    if segments is not None:
        causal = causal & block_diagonal(segments)  # [B,1,T,T]
    if attention_mask is not None:
        keep = attention_mask.bool()[:, None, None, :]  # [B,1,1,T]: padded keys hidden ...
        eye = torch.eye(t, dtype=torch.bool, device=device)
        causal = (causal & keep) | eye  # ... except a query's own key (no all-masked rows)
    elif causal.dim() == 2:
        causal = causal[None, None]  # [1,1,T,T]
    if i == 0:
        return causal
    diag = torch.eye(t, dtype=torch.bool, device=device).expand(causal.shape[0], 1, t, t)
    return torch.cat([causal] + [diag] * i, dim=-1)


def shift_left(x: Tensor, n: int, fill: int | float | bool = 0) -> Tensor:
    """x[:, t] <- x[:, t+n] along dim 1, padding the last n positions with `fill`."""
    if n == 0:
        return x
    pad = torch.full_like(x[:, :n], fill)
    if n >= x.shape[1]:
        return torch.full_like(x, fill)
    return torch.cat([x[:, n:], pad], dim=1)


def _shift_repeat_last(x: Tensor, n: int) -> Tensor:
    """x[:, t] <- x[:, t+n] along dim 1, the last n positions repeating x[:, -1]."""
    n = min(n, x.shape[1] - 1)
    if n <= 0:
        return x
    return torch.cat([x[:, n:], x[:, -1:].expand(-1, n, *x.shape[2:])], dim=1)


def valid_positions(t: int, i: int, device: torch.device | None = None) -> Tensor:
    """Bool [T]: positions whose step-i input token (t+1+i) and target logits exist."""
    return torch.arange(t, device=device) + 1 + i < t
