"""The draft's lm_head and the soft cross-entropy against the target, fused over row chunks, so
no [rows, vocab] tensor exists beyond one chunk.

For the final-norm draft states x [M,H] of the positions a loss reads, the draft lm_head W
[Vd,H], and for each row r the target's final-norm hidden row th[idx[r]] with the draft-vocab
rows of the target's lm_head Wt [Vd,Ht]:
    p[r]  = softmax(th[idx[r]] @ Wt.T)                 (float32)
    ce[r] = -sum_v p[r,v] * log_softmax(x[r] @ W.T)[v]
    loss  = sum_r wt[r] * ce[r]
`linear_soft_ce` computes the loss, ce and the draft argmax of each row, a chunk at a time: p for
a chunk of target rows (made once however many steps read them, as one p per batch would be),
then the draft logits of the rows that read those targets (`chunk_rows`: about CHUNK_ELEMS values
per chunk in all), so peak memory grows with the number of rows times the hidden size, never
times the vocab.

The loss is a weighted sum, so its gradient is known up to the one scalar the backward receives:
the forward computes it chunk by chunk while the chunk's logits exist (softmax * sum(p) - p,
times wt) and keeps only dx [M,H] and dW [Vd,H] (float32), as a fused linear cross-entropy does;
nothing is recomputed in the backward. Matmuls run in the autocast dtype when autocast is on (as
the lm_head's own would), softmaxes and the gradient of the logits in float32 (float64 for
float64 inputs).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

CHUNK_ELEMS = 1 << 25  # values in one chunk's [rows, Vd] tensor (128 MiB in float32)


def chunk_rows(vd: int, elems: int = CHUNK_ELEMS) -> int:
    """Rows per chunk for a vocab of `vd`: about `elems` logits at a time, at least one row."""
    return max(1, elems // max(1, vd))


def _compute_dtype(x: Tensor) -> torch.dtype:
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return x.dtype


class LinearSoftCE(torch.autograd.Function):
    """(loss [], ce [M], argmax [M] int64) of `linear_soft_ce`; ce and argmax carry no
    gradient."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor, th: Tensor, wt_head: Tensor, idx: Tensor,
                row_wt: Tensor, rows: int, want_x: bool, want_w: bool
                ) -> tuple[Tensor, Tensor, Tensor]:
        cdt = _compute_dtype(x)
        acc = torch.promote_types(cdt, torch.float32)  # softmaxes and ce: float32 at least
        m = x.shape[0]
        ce = torch.empty(m, dtype=acc, device=x.device)
        pred = torch.empty(m, dtype=torch.int64, device=x.device)
        dx = torch.empty_like(x) if want_x else None
        dw = torch.zeros(w.shape, dtype=acc, device=w.device) if want_w else None
        half = max(1, rows // 2)  # four [half,Vd] buffers live at once: p's, the gathered p,
        # the logits and a logsumexp temporary
        order = torch.argsort(idx, stable=True)  # x rows by their target row
        sidx = idx[order]
        with torch.autocast(x.device.type, enabled=False):
            wc, tc = w.to(cdt), wt_head.to(cdt)
            lo, hi = (int(sidx[0]), int(sidx[-1]) + 1) if m else (0, 0)
            for a in range(lo, hi, half):  # target rows [a, a+half): p made once for them
                s0, s1 = torch.searchsorted(sidx, torch.tensor([a, a + half], device=idx.device)
                                            ).tolist()
                if s0 == s1:
                    continue
                pt = (th[a:a + half].to(cdt) @ tc.T).to(acc)
                pt = pt.sub_(pt.amax(-1, keepdim=True)).exp_()  # softmax in place
                pt = pt.div_(pt.sum(-1, keepdim=True))
                for b in range(s0, s1, half):  # the x rows reading them, `half` at a time
                    sel = order[b:min(b + half, s1)]
                    p = pt.index_select(0, sidx[b:min(b + half, s1)] - a)
                    xs = x.index_select(0, sel).to(cdt)
                    lg = (xs @ wc.T).to(acc)  # [c,Vd]
                    pred[sel] = lg.argmax(-1)
                    logp = lg.sub_(lg.logsumexp(-1, keepdim=True))  # in place
                    ce[sel] = -torch.bmm(p.unsqueeze(1), logp.unsqueeze(2)).view(-1)
                    if dx is None and dw is None:
                        continue
                    # d ce / d logits = softmax * sum(p) - p, in place of logp
                    g = logp.exp_().mul_(p.sum(-1, keepdim=True)).sub_(p)
                    g.mul_(row_wt.index_select(0, sel)[:, None].to(acc))
                    gc = g.to(cdt)
                    if dx is not None:
                        dx[sel] = (gc @ wc).to(dx.dtype)
                    if dw is not None:
                        dw.add_(gc.T @ xs)
        loss = (ce * row_wt).sum()
        ctx.mark_non_differentiable(ce, pred)
        ctx.save_for_backward(dx, dw)
        ctx.dtypes = (x.dtype, w.dtype)
        return loss, ce, pred

    @staticmethod
    def backward(ctx: Any, g: Tensor, *_: Any) -> tuple[Tensor | None, ...]:
        dx, dw = ctx.saved_tensors
        gx = None if dx is None else (dx * g).to(ctx.dtypes[0])
        gw = None if dw is None else (dw * g).to(ctx.dtypes[1])
        return gx, gw, None, None, None, None, None, None, None


def linear_soft_ce(x: Tensor, w: Tensor, th: Tensor, wt_head: Tensor, idx: Tensor,
                   row_wt: Tensor, rows: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(sum_r row_wt[r] * ce[r] with its gradient to x and w, ce [M], the draft argmax
    [M]) for x [M,H], the draft lm_head w [Vd,H], the target's final-norm rows th [N,Ht] paired
    by idx [M], and the target's draft-vocab head rows wt_head [Vd,Ht] (module docstring).
    `rows` per chunk: `chunk_rows(Vd)` unless given."""
    grad = torch.is_grad_enabled()
    rows = rows or chunk_rows(w.shape[0])
    return LinearSoftCE.apply(x, w, th, wt_head, idx, row_wt, rows,
                              grad and x.requires_grad, grad and w.requires_grad)
