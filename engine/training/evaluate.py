"""Acceptance of a drafter against its target, counted the way vLLM counts it.

For each held-out sample, the prompt is everything before its first assistant token; the target
continues it greedily (`--max-new-tokens`), which is exactly the text speculative decoding with
greedy verification would produce. Speculative decoding is then replayed along that text:
at the current position the drafter proposes K tokens greedily (engine/model/draft.py
`draft_greedy`: target features of the context, the target's newest token, then its own tokens); the
target accepts the longest prefix that matches its own greedy tokens and adds one token of its own
(the bonus); the next draft starts after it. Only windows with all K positions inside the generated
text are replayed.

    acceptance_length = 1 + accepted / drafts      (vLLM's "Mean acceptance length")
    per_position[j]   = drafts whose first j+1 tokens were all accepted / drafts

How it is computed fast: samples go through the target in batches (at most `--batch-size`
samples and `--batch-tokens` padded prompt + generated tokens: a batch costs one decode step per
generated token whatever its size, so few full batches beat many small ones): one
left-padded prefill, then one batched greedy decode step per token over the KV cache, with the
aux features captured on the way (no second forward over the text). The drafter then drafts
from EVERY position of every sample at once
(`Eagle3Draft.draft_greedy_all`: k batched passes, TTT-style masks), and the replay only walks
those drafts. `--reference` keeps the one-sample, one-window-at-a-time path (a forward per draft
window) that the fast path is checked against.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from engine.data.target import Target
from engine.errors import EngineError
from engine.events import Emitter
from engine.model.draft import Eagle3Draft


@dataclass
class Acceptance:
    """Running counts of a replay."""

    k: int
    drafts: int = 0
    accepted: int = 0
    hits: list[int] = field(default_factory=list)  # per position: drafts accepted at least j+1

    def __post_init__(self) -> None:
        self.hits = self.hits or [0] * self.k

    def add(self, n_accepted: int) -> None:
        self.drafts += 1
        self.accepted += n_accepted
        for j in range(n_accepted):
            self.hits[j] += 1

    def report(self) -> dict[str, Any]:
        d = max(1, self.drafts)
        return {"acceptance_length": 1.0 + self.accepted / d,
                "per_position": [h / d for h in self.hits],
                "drafts": self.drafts, "accepted": self.accepted, "steps": self.k}


def load_draft(path: str, target: Target) -> Eagle3Draft:
    """Any style -> Eagle3Draft on the target's device, with the target's embedding."""
    from engine.ckpt.checks import load_drafter
    cfg, sd, _ = load_drafter(Path(path))
    emb = target.embed_weight()
    if cfg.vocab_size != emb.shape[0] or cfg.hidden_size != emb.shape[1]:
        raise EngineError(f"--draft {path}: vocab_size/hidden_size {cfg.vocab_size}/"
                          f"{cfg.hidden_size} do not fit the target's embedding {list(emb.shape)}")
    draft = Eagle3Draft(cfg)
    sd = {k: v for k, v in sd.items() if k != "embed_tokens.weight"}
    missing, unexpected = draft.load_state_dict({**sd, "embed_tokens.weight": emb}, strict=False)
    bad = [k for k in missing if not (k in ("d2t", "t2d") and not cfg.has_vocab_map)]
    if bad or unexpected:
        raise EngineError(f"--draft {path}: tensor {(bad or unexpected)[0]!r} missing or unknown")
    return draft.float().to(target.device).eval()


def prompt_of(ids: torch.Tensor, mask: torch.Tensor) -> list[int] | None:
    """A sample's token ids before its first assistant token (None: no assistant turn after
    a prompt)."""
    first = int(mask.nonzero()[0]) if bool(mask.any()) else -1
    return ids[:first].tolist() if first > 0 else None


def prompts_from(data: str, limit: int) -> list[list[int]]:
    """Token ids before the first assistant token of up to `limit` samples."""
    out: list[list[int]] = []
    if os.path.isdir(data):
        from engine.data.readers import open_data
        fd = open_data(data)
        for i in range(len(fd)):
            prompt = prompt_of(*fd.tokens(i))
            if prompt is not None:
                out.append(prompt)
            if len(out) >= limit:
                break
    else:
        raise EngineError(f"--data {data}: not a prepared data directory")
    if not out:
        raise EngineError(f"--data {data}: no sample with an assistant turn")
    return out


@torch.no_grad()
def greedy_continue(target: Target, prompt: list[int], max_new: int) -> list[int]:
    tok = target.tokenizer
    eos = tok.convert_tokens_to_ids(tok.eos_token) if tok is not None and tok.eos_token else None
    ids = torch.tensor([prompt], device=target.device)
    gen = target.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                max_new_tokens=max_new, do_sample=False, eos_token_id=eos,
                                pad_token_id=eos if eos is not None else 0)
    return gen[0].tolist()


@torch.no_grad()
def replay(draft: Eagle3Draft, aux: Tensor, seq: Tensor, start: int, k: int, acc: Acceptance
           ) -> None:
    """Replay speculative decoding along `seq` [L] (prompt + greedy text) from position `start`,
    the prompt's last token; aux [1,L,3Ht] are the target's features over seq."""
    n = seq.numel()
    p = start  # the target has just produced seq[p+1] (its bonus / first token)
    while p + 1 + k < n:
        drafts = draft.draft_greedy(aux[:, :p + 1], seq[None, :p + 2], k)[0]  # [k] target ids
        truth = seq[p + 2:p + 2 + k]
        match = (drafts == truth).int()
        a = int(match.cumprod(0).sum())
        acc.add(a)
        p += a + 1


def _left_padded(prompts: list[list[int]], pad: int, dev: torch.device | str
                 ) -> tuple[Tensor, Tensor]:
    """ids and attention mask [B, width], left-padded: every prompt ends at the same column."""
    b, width = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((b, width), pad, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = torch.tensor(p)
        mask[r, width - len(p):] = 1
    return ids.to(dev), mask.to(dev)


def _per_row(captured: list[Tensor], steps: list[Tensor]) -> Tensor:
    """One layer's features [B, width + steps, H] from what its hook saw: the prefill's
    [B, width, H], then decode step j's [rows_j, 1, H], put back at (row, width + j) (a row's
    fed tokens stay contiguous from `width` on; a finished row's later slots stay zero)."""
    pre, *dec = captured
    b, width = pre.shape[:2]
    full = pre.new_zeros((b, width + len(dec), pre.shape[-1]))
    full[:, :width] = pre
    for j, (fed, h) in enumerate(zip(steps, dec, strict=True)):
        full[fed, width + j] = h[:, 0]
    return full


@torch.inference_mode()  # not just no_grad: no version counters or view tracking per op
def greedy_with_features(target: Target, prompts: list[list[int]], max_new: int
                         ) -> tuple[list[list[int]], list[Tensor]]:
    """`greedy_continue` of several prompts at once, and the target's aux features of every
    token fed on the way: one left-padded prefill, then one batched decode step per new token
    over the KV cache, until every row has produced EOS or `max_new` tokens (what `generate`
    does, without its per-step machinery). A row that has produced EOS leaves the batch (its
    KV cache rows are dropped with the cache's `reorder_cache`): greedy continuations end at
    very different lengths (on the demo most rows stop within 20 tokens and a few run to 64),
    and a finished row would otherwise cost a full row of every later step.
    The aux states are captured by the same pre-hooks as `Target.features`, so row r's features
    [len(seq) - 1, 3Ht] are those of a teacher-forced forward over seq[:-1] (the last token is
    never fed, and never needed: a draft starts after the token the target has just produced);
    the continuation ends with its EOS, as the one-prompt call stops there."""
    tok = target.tokenizer
    eos = tok.convert_tokens_to_ids(tok.eos_token) if tok is not None and tok.eos_token else None
    pad = eos if eos is not None else 0
    dev = target.device
    ids, mask = _left_padded(prompts, pad, dev)
    b, width = ids.shape
    base = target._decoder()
    n_layers = target.num_layers
    captured: dict[int, list[Tensor]] = {k: [] for k in set(target.aux_layer_ids)}

    def grab(k: int) -> Any:
        def hook(_mod: Any, args: tuple, kwargs: dict) -> None:
            captured[k].append(args[0] if args else kwargs["hidden_states"])
        return hook

    handles = [(base.layers[k] if k < n_layers else base.norm).register_forward_pre_hook(
        grab(k), with_kwargs=True) for k in captured]
    gen: list[list[int]] = [[] for _ in prompts]
    steps: list[Tensor] = []  # per decode step: the original rows it fed, in batch order
    try:
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # real positions; padding sits at 0
        out = target.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                           logits_to_keep=1)
        rows = torch.arange(b, device=dev)  # the original row of each batch row
        last = pos[:, -1]
        while True:
            nxt = out.logits[:, -1].argmax(-1)  # [rows]
            for r, t in zip(rows.tolist(), nxt.tolist(), strict=True):
                gen[r].append(t)
            live = nxt != eos if eos is not None else torch.ones_like(nxt, dtype=torch.bool)
            if len(steps) + 1 >= max_new or not bool(live.any()):  # live rows made 1 + steps
                break
            if not bool(live.all()):  # finished rows leave the batch and its cache
                keep = live.nonzero()[:, 0]
                out.cache.reorder_cache(keep)
                rows, nxt, mask, last = rows[keep], nxt[keep], mask[keep], last[keep]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            last = last + 1
            steps.append(rows)
            out = target.model(input_ids=nxt[:, None], attention_mask=mask,
                               position_ids=last[:, None], cache=out.cache, use_cache=True,
                               logits_to_keep=1)
    finally:
        for h in handles:
            h.remove()
    aux = torch.cat([_per_row(captured[k], steps) for k in target.aux_layer_ids], dim=-1)
    seqs: list[list[int]] = []
    feats: list[Tensor] = []
    for r, p in enumerate(prompts):
        seqs.append(p + gen[r])
        start = width - len(p)
        feats.append(aux[r, start:start + len(p) + len(gen[r]) - 1])  # seq[:-1]'s features
    return seqs, feats


@torch.inference_mode()
def replay_batch(draft: Eagle3Draft, seqs: list[list[int]], feats: list[Tensor],
                 starts: list[int], k: int, acc: Acceptance) -> None:
    """`replay` for several sequences: one `draft_greedy_all` over them all (right-padded:
    causal attention keeps padding out of real rows), then the acceptance walk over the
    precomputed drafts (no forward per window)."""
    width = max(len(s) for s in seqs)
    dev = feats[0].device
    ids = torch.zeros((len(seqs), width), dtype=torch.long, device=dev)
    aux = torch.zeros((len(seqs), width - 1, feats[0].shape[-1]), device=dev)
    for r, (s, f) in enumerate(zip(seqs, feats, strict=True)):
        ids[r, :len(s)] = torch.tensor(s, device=dev)
        aux[r, :len(f)] = f.float()
    drafts = draft.draft_greedy_all(aux, ids, k).tolist()  # [B,W-1,k]
    for r, (s, p) in enumerate(zip(seqs, starts, strict=True)):
        n = len(s)
        while p + 1 + k < n:  # the same walk as `replay`
            truth = s[p + 2:p + 2 + k]
            a = 0
            while a < k and drafts[r][p][a] == truth[a]:
                a += 1
            acc.add(a)
            p += a + 1


def batches(lengths: list[int], max_new: int, batch_size: int, batch_tokens: int
            ) -> list[list[int]]:
    """Sample indices in groups for `greedy_with_features`: sorted by prompt length (similar
    lengths share a batch, less padding; the counts do not depend on order), each group at most
    `batch_size` rows and at most `batch_tokens` tokens of KV cache (rows x (longest prompt +
    max_new)); a prompt longer than the budget still gets a batch of its own."""
    out: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        cur = out[-1] if out else None
        if cur is not None and len(cur) < batch_size and \
                (len(cur) + 1) * (lengths[i] + max_new) <= batch_tokens:
            cur.append(i)
        else:
            out.append([i])
    return out


def evaluate(draft_path: str, target_dir: str, data: str, k: int = 3, max_samples: int = 64,
             max_new_tokens: int = 64, device: str | None = None, ev: Emitter | None = None,
             batch_size: int = 64, batch_tokens: int = 32768, reference: bool = False
             ) -> dict[str, Any]:
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    if k < 1:
        raise EngineError(f"--steps {k}: must be >= 1")
    if batch_size < 1:
        raise EngineError(f"--batch-size {batch_size}: must be >= 1")
    if batch_tokens < 1:
        raise EngineError(f"--batch-tokens {batch_tokens}: must be >= 1")
    t0 = time.monotonic()
    target = Target.load(target_dir, device=device)
    draft = load_draft(draft_path, target)
    ids = draft.config.resolved_aux_layer_ids(target.num_layers)
    target.aux_layer_ids = ids
    prompts = prompts_from(data, max_samples)
    acc = Acceptance(k)
    generated = 0
    t1 = time.monotonic()  # loading done: what follows is the evaluation itself
    if reference:
        for i, prompt in enumerate(prompts):
            full = greedy_continue(target, prompt, max_new_tokens)
            generated += len(full) - len(prompt)
            seq = torch.tensor(full, device=target.device)
            aux, _ = target.features(seq[None])
            replay(draft, aux.float(), seq, len(prompt) - 1, k, acc)
            if ev is not None:
                ev.progress(i + 1, len(prompts), unit="sample", desc="eval")
    else:
        done = 0
        for group in batches([len(p) for p in prompts], max_new_tokens, batch_size,
                             batch_tokens):
            chunk = [prompts[i] for i in group]
            fulls, feats = greedy_with_features(target, chunk, max_new_tokens)
            generated += sum(len(f) - len(p) for f, p in zip(fulls, chunk, strict=True))
            replay_batch(draft, fulls, feats, [len(p) - 1 for p in chunk], k, acc)
            done += len(chunk)
            if ev is not None:
                ev.progress(done, len(prompts), unit="sample", desc="eval")
    out = acc.report()
    out.update(samples=len(prompts), generated_tokens=generated, draft=str(draft_path),
               target=str(target_dir), seconds=round(time.monotonic() - t0, 2),
               eval_seconds=round(time.monotonic() - t1, 3))
    return out
