"""The EAGLE-3 training objective (training-time test: K unrolled steps, each predicting one
token further ahead) and its metrics.

Alignment follows engine/model/draft.py: `logits[i][:, t]` predicts token t+2+i, so its target
distribution is the target's logits at position t+1+i and its loss mask is the loss mask of token
t+2+i.
- target distribution: the target's logits restricted to the draft vocab (t2d columns), softmaxed.
- position mask at step i: loss_mask(t+2+i) AND the target's argmax at t+1+i is in the draft vocab.
- loss_i = -sum(mask * p_target * log_softmax(draft_logits)) / denom, total = sum 0.8^i loss_i.
  `denom` is the number of supervised step-0 positions in the WHOLE global batch (all micro-batches
  and ranks), known before the step from the data plan: summing per-micro-batch losses then gives
  the same number, and the same gradient, whatever the split across ranks and accumulation.
- acc_i: draft argmax mapped through d2t == target argmax, over the step's position mask.
- the target side is computed once per batch and only what is needed: the draft-vocab rows of
  the target's lm_head (read once per run: engine/ckpt/target_weights.py `TargetHead.rows`, or
  `draft_head` of a head in memory) give p over the draft vocab;
  the target's argmax over the FULL vocab comes from the data when prepare stored it
  (`target_argmax`), else from `target_argmax` here (chunked, float32, no [T,V] logits kept).
- the per-step loss is one log_softmax and a dot product (`SoftCrossEntropy`), on flattened
  token rows paired with the target rows 1+i further on: no shifted [T,Vd] copies of p.
- only the positions a step's loss reads get logits: `step_rows` lists them (flat indices of
  the step's position mask) and the model computes norm + lm_head for those rows alone
  (engine/model/draft.py `ttt_forward(rows=)`); prompt tokens, padding and targets outside the draft
  vocab cost no lm_head work, no log_softmax and no saved [T,Vd] activations. The result is the
  full-logits objective, up to float summation order (fewer rows in each reduction).
- the trainer's loss is `ttt_loss_fused`: the same objective from the lm_head's input (the
  final-norm draft states at `step_rows`), with the lm_head, p over the draft vocab (from the
  target's hidden rows) and the soft cross-entropy fused over chunks of rows
  (engine/model/fused_ce.py), so no [T,Vd] logits, p or log_softmax exist at all: peak memory
  does not grow with T x V. `ttt_loss` on given logits stays the reference it is tested against.
- tau (estimated acceptance length of a greedy chain of K drafts, vLLM counting, bonus included):
  1 + sum over n of the fraction of supervised positions whose first n drafts are all right.
  Chains run teacher-forced along the data, which the target itself generated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from engine.model.draft import shift_left
from engine.model.fused_ce import linear_soft_ce
from engine.model.packing import same_segment

STEP_WEIGHT = 0.8
GATHER_ROWS = 1024  # rows of p gathered at once by SoftCrossEntropy (a bounded transient)


def draft_head(lm_head: Tensor, draft_ids: Tensor) -> Tensor:
    """The draft-vocab rows of the target's lm_head [Vd, Ht] (gather once per run)."""
    return lm_head[draft_ids].contiguous()


@torch.no_grad()
def target_argmax(hidden: Tensor, lm_head: Tensor, rows: int = 1024, cols: int = 32768
                  ) -> Tensor:
    """The target's argmax over its full vocab [..] (int64) for final-norm hidden states
    [.., Ht]: float32 logits hidden @ lm_head.T, computed in blocks of `rows` tokens x `cols`
    vocab ids (no [T, V] tensor; one block is 128 MiB, whatever T and V), first index on ties
    like `argmax`. prepare stores it
    (`target_argmax` in the shards) and training computes it with the same function when the
    data has none."""
    shape = hidden.shape[:-1]
    h = hidden.reshape(-1, hidden.shape[-1])
    out = torch.empty(h.shape[0], dtype=torch.int64, device=h.device)
    with torch.autocast(h.device.type, enabled=False):
        for a in range(0, h.shape[0], rows):
            hf = h[a:a + rows].float()
            best: Tensor | None = None
            idx: Tensor | None = None
            for c in range(0, lm_head.shape[0], cols):
                w = lm_head[c:c + cols].to(hf.device, torch.float32)
                val, arg = (hf @ w.T).max(-1)
                if best is None or idx is None:
                    best, idx = val, arg + c
                else:
                    better = val > best  # strict: an earlier block wins a tie
                    best = torch.where(better, val, best)
                    idx = torch.where(better, arg + c, idx)
            assert idx is not None
            out[a:a + rows] = idx
    return out.view(shape)


def target_distribution(hidden: Tensor, head_d: Tensor, top: Tensor, t2d: Tensor
                        ) -> tuple[Tensor, Tensor]:
    """hidden [B,T,Ht] (final-norm), the draft-vocab head rows `head_d` [Vd,Ht] and the target's
    argmax `top` [B,T] -> p over the draft vocab [B,T,Vd] (float32, the target's logits restricted
    to the draft vocab, softmaxed) and whether the argmax is in the draft vocab [B,T]."""
    logits = hidden.to(head_d.dtype) @ head_d.T  # [B,T,Vd]
    return torch.softmax(logits.float(), dim=-1), t2d[top]


class SoftCrossEntropy(torch.autograd.Function):
    """ce[r] = -sum_v p[r,v] * log_softmax(logits[r])[v] for rows r, with p's row sums given
    (the backward's softmax * psum - p). Saves only the log_softmax, as log_softmax itself does;
    no product tensor is kept or made in the forward.

    With `idx`, row r of logits pairs with row idx[r] of p and psum: p's rows are gathered
    GATHER_ROWS at a time where they are used, in the forward and again in the backward (p itself
    is saved; no [M,V] copy of it is made).
    """

    @staticmethod
    def forward(ctx, logits: Tensor, p: Tensor, psum: Tensor, idx: Tensor | None = None
                ) -> Tensor:
        with torch.autocast(logits.device.type, enabled=False):
            logp = torch.log_softmax(logits.float(), dim=-1)  # [M,V]
            work = torch.promote_types(p.dtype, logp.dtype)
            if idx is None:
                ce = -torch.bmm(p.to(work).unsqueeze(1), logp.to(work).unsqueeze(2)).view(-1)
            else:
                ce = logp.new_empty(logp.shape[0], dtype=work)  # [M]
                for a in range(0, idx.numel(), GATHER_ROWS):
                    pr = p.index_select(0, idx[a:a + GATHER_ROWS]).to(work)
                    lr = logp[a:a + GATHER_ROWS].to(work)
                    ce[a:a + GATHER_ROWS] = -torch.bmm(pr.unsqueeze(1), lr.unsqueeze(2)).view(-1)
        ctx.save_for_backward(logp, p, psum, idx)
        ctx.in_dtype = logits.dtype
        return ce

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, ...]:
        logp, p, psum, idx = ctx.saved_tensors
        grad = logp.exp()
        if idx is None:
            grad.mul_(psum[:, None]).sub_(p)
        else:
            grad.mul_(psum.index_select(0, idx)[:, None])
            for a in range(0, idx.numel(), GATHER_ROWS):
                grad[a:a + GATHER_ROWS].sub_(p.index_select(0, idx[a:a + GATHER_ROWS]))
        grad.mul_(g[:, None])
        return grad.to(ctx.in_dtype), None, None, None


def _step_ce(lg: Tensor, p2: Tensor, psum: Tensor, shift: int) -> Tensor:
    """ce [B,T] of draft logits lg [B,T,Vd] against the target rows `shift` positions on.
    Rows are paired on the flattened token axis; pairs that cross into the next sample are
    finite garbage at positions every step mask excludes (t + shift >= T), zero past the end."""
    b, t, vd = lg.shape
    n = b * t
    m = max(0, n - shift)
    ce = SoftCrossEntropy.apply(lg.reshape(n, vd)[:m], p2[shift:shift + m], psum[shift:shift + m])
    if m < n:
        ce = torch.cat([ce, ce.new_zeros(n - m)])
    return ce.view(b, t)


def supervised(loss_mask: Tensor, n: int, segments: Tensor | None = None) -> Tensor:
    """Bool [B,T]: loss_mask(t+n), and in packed rows t+n in t's own sample."""
    sup = shift_left(loss_mask, n).bool()
    return sup if segments is None else sup & same_segment(segments, n)


def step_masks(loss_mask: Tensor, in_vocab: Tensor, k: int, segments: Tensor | None = None
               ) -> list[Tensor]:
    """Step i's position mask [B,T]: loss_mask(t+2+i) and the target argmax at t+1+i in the
    draft vocab (module docstring); packed rows: t+2+i in t's own sample."""
    return [supervised(loss_mask, 2 + i, segments) & shift_left(in_vocab, 1 + i)
            for i in range(k)]


def step_rows(loss_mask: Tensor, in_vocab: Tensor, k: int, segments: Tensor | None = None
              ) -> list[Tensor]:
    """The flat positions (indices into B*T) of each step's mask: the rows `ttt_forward(rows=)`
    computes logits for and `ttt_loss(rows=)` reads."""
    return [m.reshape(-1).nonzero().squeeze(1)
            for m in step_masks(loss_mask, in_vocab, k, segments)]


def ttt_loss(logits: list[Tensor], p: Tensor, top: Tensor, in_vocab: Tensor, loss_mask: Tensor,
             d2t: Tensor, denom: float, rows: list[Tensor] | None = None,
             segments: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(weighted total loss, stats vector) for one micro-batch. `logits` are [B,T,Vd] each, or
    [n_i,Vd] for the positions `rows` (step_rows) when given; `segments`: packed rows.

    stats (float64, summable across micro-batches and ranks), K = len(logits):
        [0:K]    loss_i * 1       (already divided by denom)
        [K:2K]   correct_i        (on the step's position mask)
        [2K:3K]  count_i          (positions in the step's mask)
        [3K]     chain sum        (sum over n of positions whose first n drafts are right)
        [3K+1]   supervised step-0 positions
    """
    p2 = p.reshape(-1, p.shape[-1])  # [B*T,Vd]
    psum = p2.sum(-1)
    total = p.new_zeros(())
    masks = step_masks(loss_mask, in_vocab, len(logits), segments)
    losses: list[Tensor] = []
    for i, lg in enumerate(logits):
        if rows is None:
            ce = _step_ce(lg, p2, psum, 1 + i)  # [B,T]
            loss_i = (ce * masks[i]).sum() / denom
        else:
            loss_i = SoftCrossEntropy.apply(lg, p2, psum, rows[i] + (1 + i)).sum() / denom
        total = total + (STEP_WEIGHT ** i) * loss_i
        losses.append(loss_i.detach())
    with torch.no_grad():
        preds = [lg.argmax(-1) for lg in logits]
    return total, _stats(losses, preds, top, loss_mask, masks, d2t, rows, segments)


@dataclass(frozen=True)
class TargetSide:
    """What the fused loss reads of the target for one micro-batch: its final-norm hidden
    states [B,T,Ht], the draft-vocab rows of its lm_head [Vd,Ht], its argmax over the full vocab
    [B,T] and whether that argmax is in the draft vocab [B,T]."""

    hidden: Tensor
    head_d: Tensor
    top: Tensor
    in_vocab: Tensor


def ttt_loss_fused(states: list[Tensor], lm_head: Tensor, target: TargetSide, loss_mask: Tensor,
                   d2t: Tensor, denom: float, rows: list[Tensor], chunk: int | None = None,
                   segments: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """`ttt_loss(rows=)` from the lm_head's input instead of its output: `states` are the
    final-norm draft states [n_i,H] of each step's `rows` (`ttt_forward(head=False)`), `lm_head`
    the draft's [Vd,H]. All K steps go through one `linear_soft_ce` (each row weighted
    0.8^i / denom), so no [n,Vd] logits or p exist beyond one chunk of rows (fused_ce.py)."""
    k = len(states)
    masks = step_masks(loss_mask, target.in_vocab, k, segments)
    sizes = [int(r.numel()) for r in rows]
    x = torch.cat(states) if k > 1 else states[0]
    idx = torch.cat([r + (1 + i) for i, r in enumerate(rows)])
    acc = torch.promote_types(x.dtype, torch.float32)
    wt = torch.cat([torch.full((n,), STEP_WEIGHT ** i / denom, dtype=acc, device=x.device)
                    for i, n in enumerate(sizes)])
    th = target.hidden.reshape(-1, target.hidden.shape[-1])
    total, ce, pred = linear_soft_ce(x, lm_head, th, target.head_d, idx, wt, chunk)
    losses = [c.sum() / denom for c in ce.split(sizes)]
    return total, _stats(losses, list(pred.split(sizes)), target.top, loss_mask, masks, d2t,
                         rows, segments)


def _stats(losses: list[Tensor], preds: list[Tensor], top: Tensor, loss_mask: Tensor,
           masks: list[Tensor], d2t: Tensor, rows: list[Tensor] | None,
           segments: Tensor | None) -> Tensor:
    """The stats vector of `ttt_loss` from each step's loss and draft argmax ([B,T], or [n_i]
    at `rows`)."""
    k = len(losses)
    stats = torch.zeros(3 * k + 2, dtype=torch.float64, device=top.device)
    sup0 = supervised(loss_mask, 2, segments)  # [B,T]
    chain = sup0.clone()
    chain_sum = torch.zeros((), dtype=torch.float64, device=top.device)
    for i, pred in enumerate(preds):
        sup = supervised(loss_mask, 2 + i, segments)
        if rows is None:
            right = (pred + d2t[pred]) == shift_left(top, 1 + i)  # [B,T]
        else:  # right only where the mask is: the only places the stats read it
            flat = top.reshape(-1)
            right = torch.zeros_like(flat, dtype=torch.bool)
            right[rows[i]] = (pred + d2t[pred]) == flat[rows[i] + (1 + i)]
            right = right.view_as(top)
        chain = chain & right & sup
        chain_sum = chain_sum + chain.sum()
        stats[i] = losses[i].double()
        stats[k + i] = (right & masks[i]).sum()
        stats[2 * k + i] = masks[i].sum()
    stats[3 * k] = chain_sum
    stats[3 * k + 1] = sup0.sum()
    return stats


def summarize(stats: Tensor, k: int) -> dict[str, float]:
    """Stats vector (summed over a global batch) -> loss, loss_i, acc_i, tau."""
    s = stats.tolist()
    out: dict[str, float] = {}
    loss = 0.0
    for i in range(k):
        out[f"loss_{i}"] = s[i]
        loss += (STEP_WEIGHT ** i) * s[i]
        out[f"acc_{i}"] = s[k + i] / s[2 * k + i] if s[2 * k + i] else 0.0
    out["loss"] = loss
    out["tau"] = 1.0 + (s[3 * k] / s[3 * k + 1] if s[3 * k + 1] else 0.0)
    return out
