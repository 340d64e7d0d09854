"""The MLA draft-layer kind: DeepSeek-V2/V3 multi-head latent attention over the 2H input.

The drafter of vLLM 0.32's `Eagle3DeepseekV2ForCausalLM` (deepseek_eagle3.py) and TorchSpec's
`*_eagle3_mla` drafters (docs/eagle3.md#mla-drafters). Everything around the attention is
the EAGLE-3 layer of engine/model/draft.py (`DecoderLayer`: hidden_norm, input_layernorm,
[embedding; hidden] 2H input, residual, dense SiLU MLP) and its shared unroll; this file is
only the attention, picked by `Eagle3Config.layer_kind == "mla"`. Parameter names are vLLM's
and transformers':

    midlayer.self_attn.q_a_proj.weight            [q_lora, 2H]   (q_lora_rank set)
    midlayer.self_attn.q_a_layernorm.weight       [q_lora]
    midlayer.self_attn.q_b_proj.weight            [nh*(nope+rope), q_lora]
    midlayer.self_attn.q_proj.weight              [nh*(nope+rope), 2H]   (q_lora_rank None)
    midlayer.self_attn.kv_a_proj_with_mqa.weight  [kv_lora+rope, 2H]
    midlayer.self_attn.kv_a_layernorm.weight      [kv_lora]
    midlayer.self_attn.kv_b_proj.weight           [nh*(nope+v), kv_lora]
    midlayer.self_attn.o_proj.weight              [H, nh*v]

(vLLM fuses q_a_proj and kv_a_proj_with_mqa into `fused_qkv_a_proj` on load; checkpoints keep
them apart.) The math, per position:
    q = q_b(norm_qa(q_a(x)))  or q_proj(x)           -> [nh, nope | rope]
    c, k_rot = kv_a(x) split [kv_lora | rope]        (k_rot: ONE rope key shared by all heads)
    k_nope, v = kv_b(norm_kva(c)) split per head [nope | v]
    k = [k_nope | rope(k_rot)], q = [q_nope | rope(q_rot)]
    softmax scale 1/sqrt(nope+rope), times yarn's mscale(factor, mscale_all_dim)^2 when set.
RoPE is interleaved (GPT-J pairs (0,1), (2,3), ..: vLLM's is_neox_style=False, transformers'
rope_interleave): the rope dims are reordered evens-then-odds and rotated half-wise, which gives
the same q.k (q and k reordered alike; the rope part is never read except in q.k). The yarn
tables (frequencies, cos/sin mscale) are the unroll's, sized by head_dim = qk_rope_head_dim.

After decompression K/V are ordinary per-head tensors, so the TTT attention without a mask
(engine/model/ttt_attention.py) applies unchanged: each step's (k, v) extends the past as for
the Llama layer. Values are zero-padded to the q/k width there (the step-0 flash kernels take
one head width; zero columns add nothing to the scores or the kept output columns).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.model.blocks import KV, RMSNorm, apply_rope
from engine.model.config import Eagle3Config
from engine.model.packing import Spans
from engine.model.ttt_attention import split_attention

__all__ = ["MLAttention", "mla_softmax_scale"]


def _mscale(scale: float, m: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def mla_softmax_scale(cfg: Eagle3Config) -> float:
    """1/sqrt(qk head width), times mscale(factor, mscale_all_dim)^2 under yarn (DeepSeek's
    `softmax_scale`; vLLM's and transformers' `scaling`)."""
    assert cfg.qk_nope_head_dim is not None and cfg.qk_rope_head_dim is not None
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    rs = cfg.rope_scaling
    if rs and rs.get("rope_type") == "yarn" and rs.get("mscale_all_dim"):
        m = _mscale(float(rs["factor"]), float(rs["mscale_all_dim"]))
        scale *= m * m
    return scale


class MLAttention(nn.Module):
    """MLA whose down-projections (q_a or q, kv_a) read the 2H [embedding, hidden] input.

    Same contract as draft.Attention: `embed_part(e)` is the embedding half's share of the
    down-projections (computed once per token for all TTT steps), `forward(ep, hn, ...)` adds
    the hidden half's and returns (out [B,T,H], this step's (k, v)): k [B,nh,T,W], v [B,nh,T,W]
    with W = max(nope+rope, v) (v zero-padded)."""

    perm: Tensor

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        assert cfg.kv_lora_rank is not None and cfg.qk_nope_head_dim is not None
        assert cfg.qk_rope_head_dim is not None and cfg.v_head_dim is not None
        self.nh, self.kv_lora, self.q_lora = (cfg.num_attention_heads, cfg.kv_lora_rank,
                                              cfg.q_lora_rank)
        self.nope, self.rope, self.vd = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.qk = self.nope + self.rope
        self.width = max(self.qk, self.vd)
        h2, eps = 2 * cfg.hidden_size, cfg.rms_norm_eps
        if self.q_lora is not None:
            self.q_a_proj = nn.Linear(h2, self.q_lora, bias=False)
            self.q_a_layernorm = RMSNorm(self.q_lora, eps)
            self.q_b_proj = nn.Linear(self.q_lora, self.nh * self.qk, bias=False)
        else:
            self.q_proj = nn.Linear(h2, self.nh * self.qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h2, self.kv_lora + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_lora, eps)
        self.kv_b_proj = nn.Linear(self.kv_lora, self.nh * (self.nope + self.vd), bias=False)
        self.o_proj = nn.Linear(self.nh * self.vd, cfg.hidden_size, bias=False)
        self.scale = mla_softmax_scale(cfg)
        # interleaved pairs -> evens then odds, so the rotate-half RoPE rotates pair (2i, 2i+1)
        self.register_buffer("perm", torch.cat([torch.arange(0, self.rope, 2),
                                                torch.arange(1, self.rope, 2)]), persistent=False)

    def _down(self) -> tuple[nn.Linear, nn.Linear]:
        """The two projections that read the 2H input: (q_a_proj or q_proj, kv_a_proj_with_mqa)."""
        q = self.q_a_proj if self.q_lora is not None else self.q_proj
        return q, self.kv_a_proj_with_mqa

    def embed_part(self, e: Tensor) -> Tensor:
        """e [B,T,H] (the normalised embedding) -> its part of (q_a | q, kv_a), [B,T,nq+kv_lora+
        rope] (the FIRST H columns of both weights: views, nothing copied)."""
        h = e.shape[-1]
        return torch.cat([F.linear(e, p.weight[:, :h]) for p in self._down()], dim=-1)

    def forward(self, ep: Tensor, hn: Tensor, cos: Tensor, sin: Tensor, past: list[KV],
                mask: Tensor | Spans | None, causal: bool = True) -> tuple[Tensor, KV]:
        """As draft.Attention.forward: mask None (or packed rows' Spans) is the TTT split
        attention over past[0] (causal) plus the later steps' keys at the query's own position;
        else `mask`
        [B|1,1,T,S] over the concatenated keys (the dense path)."""
        b, t, h = hn.shape
        qd, kvd = self._down()
        eq, ekv = ep.split((qd.out_features, kvd.out_features), -1)
        q_in = eq + F.linear(hn, qd.weight[:, h:])  # [B,T,q_lora | nh*qk]
        kv_a = ekv + F.linear(hn, kvd.weight[:, h:])  # [B,T,kv_lora+rope]
        if self.q_lora is not None:
            q_in = self.q_b_proj(self.q_a_layernorm(q_in))
        q = q_in.view(b, t, self.nh, self.qk).transpose(1, 2)  # [B,nh,T,qk]
        c, k_rot = kv_a.split((self.kv_lora, self.rope), -1)
        kv = self.kv_b_proj(self.kv_a_layernorm(c)).view(b, t, self.nh, self.nope + self.vd)
        k_nope, v = kv.transpose(1, 2).split((self.nope, self.vd), -1)  # [B,nh,T,nope|v]
        q_nope, q_rot = q.split((self.nope, self.rope), -1)
        q_rot = apply_rope(q_rot[..., self.perm], cos, sin)  # [B,nh,T,rope]
        k_rot = apply_rope(k_rot[:, None, :, self.perm], cos, sin)  # [B,1,T,rope], all heads
        q = _pad(torch.cat([q_nope, q_rot], -1), self.width)
        k = _pad(torch.cat([k_nope, k_rot.expand(b, self.nh, t, self.rope)], -1), self.width)
        v = _pad(v, self.width)  # [B,nh,T,W]
        if not isinstance(mask, Tensor):
            k0, v0 = past[0] if past else (k, v)
            diag = [*past[1:], (k, v)] if past else []
            out = split_attention(q, k0, v0, diag, causal, scale=self.scale,  # [B,nh,T,W]
                                  spans=mask)
        else:
            keys = torch.cat([kv_[0] for kv_ in past] + [k], dim=2)  # [B,nh,S,W]
            vals = torch.cat([kv_[1] for kv_ in past] + [v], dim=2)
            out = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask, scale=self.scale)
        out = out[..., :self.vd].transpose(1, 2).reshape(b, t, self.nh * self.vd)
        return self.o_proj(out), (k, v)


def _pad(x: Tensor, width: int) -> Tensor:
    """Zero columns up to `width` on the last dim (q/k: no change to q.k; v: dropped after)."""
    return x if x.shape[-1] == width else F.pad(x, (0, width - x.shape[-1]))
