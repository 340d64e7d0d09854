"""The EAGLE-3 training objective and its metrics (spec section 5).

Alignment follows engine/model.py: `logits[i][:, t]` predicts token t+2+i, so its target
distribution is the target's logits at position t+1+i and its loss mask is the loss mask of token
t+2+i.
- target distribution: the target's logits restricted to the draft vocab (t2d columns), softmaxed.
- position mask at step i: loss_mask(t+2+i) AND the target's argmax at t+1+i is in the draft vocab.
- loss_i = -sum(mask * p_target * log_softmax(draft_logits)) / denom, total = sum 0.8^i loss_i.
  `denom` is the number of supervised step-0 positions in the WHOLE global batch (all micro-batches
  and ranks), known before the step from the data plan: summing per-micro-batch losses then gives
  the same number, and the same gradient, whatever the split across ranks and accumulation.
- acc_i: draft argmax mapped through d2t == target argmax, over the step's position mask.
- tau (estimated acceptance length of a greedy chain of K drafts, vLLM counting, bonus included):
  1 + sum over n of the fraction of supervised positions whose first n drafts are all right.
  Chains run teacher-forced along the data, which the target itself generated.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.model import shift_left

STEP_WEIGHT = 0.8


def target_distribution(hidden: Tensor, lm_head: Tensor, draft_ids: Tensor, t2d: Tensor
                        ) -> tuple[Tensor, Tensor, Tensor]:
    """hidden [B,T,Ht] (final-norm) -> p over the draft vocab [B,T,Vd] (float32), the target's
    argmax [B,T] (target ids) and whether that argmax is in the draft vocab [B,T]."""
    logits = hidden.to(lm_head.dtype) @ lm_head.T  # [B,T,V]
    top = logits.argmax(-1)  # [B,T]
    p = torch.softmax(logits[..., draft_ids].float(), dim=-1)  # [B,T,Vd]
    return p, top, t2d[top]


def ttt_loss(logits: list[Tensor], p: Tensor, top: Tensor, in_vocab: Tensor, loss_mask: Tensor,
             d2t: Tensor, denom: float) -> tuple[Tensor, Tensor]:
    """(weighted total loss, stats vector) for one micro-batch.

    stats (float64, summable across micro-batches and ranks), K = len(logits):
        [0:K]    loss_i * 1       (already divided by denom)
        [K:2K]   correct_i        (on the step's position mask)
        [2K:3K]  count_i          (positions in the step's mask)
        [3K]     chain sum        (sum over n of positions whose first n drafts are right)
        [3K+1]   supervised step-0 positions
    """
    k = len(logits)
    stats = torch.zeros(3 * k + 2, dtype=torch.float64, device=p.device)
    total = p.new_zeros(())
    sup0 = shift_left(loss_mask, 2).bool()  # [B,T]
    chain = sup0.clone()
    chain_sum = p.new_zeros((), dtype=torch.float64)
    for i, lg in enumerate(logits):
        sup = shift_left(loss_mask, 2 + i).bool()
        mask = sup & shift_left(in_vocab, 1 + i)  # [B,T]
        p_i = shift_left(p, 1 + i)  # [B,T,Vd]
        logp = F.log_softmax(lg.float(), dim=-1)
        ce = -(p_i * logp).sum(-1)  # [B,T]
        loss_i = (ce * mask).sum() / denom
        total = total + (STEP_WEIGHT ** i) * loss_i
        with torch.no_grad():
            pred = lg.argmax(-1)
            right = (pred + d2t[pred]) == shift_left(top, 1 + i)  # [B,T]
            chain = chain & right & sup
            chain_sum = chain_sum + chain.sum()
            stats[i] = loss_i.detach().double()
            stats[k + i] = (right & mask).sum()
            stats[2 * k + i] = mask.sum()
    stats[3 * k] = chain_sum
    stats[3 * k + 1] = sup0.sum()
    return total, stats


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
