"""The TTT loss and the target side (engine/model/ttt_loss.py) against the straightforward
formulation it replaced: full-vocab target logits, shifted copies of p, log_softmax and a product
sum."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.model.draft import shift_left
from engine.model.ttt_loss import (
    STEP_WEIGHT,
    draft_head,
    step_rows,
    target_argmax,
    target_distribution,
    ttt_loss,
)


def reference_target(hidden: torch.Tensor, lm_head: torch.Tensor, draft_ids: torch.Tensor,
                     t2d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logits = hidden.to(lm_head.dtype) @ lm_head.T  # [B,T,V]
    top = logits.argmax(-1)
    p = torch.softmax(logits[..., draft_ids].float(), dim=-1)
    return p, top, t2d[top]


def reference_loss(logits: list[torch.Tensor], p: torch.Tensor, in_vocab: torch.Tensor,
                   loss_mask: torch.Tensor, denom: float) -> torch.Tensor:
    total = p.new_zeros(())
    for i, lg in enumerate(logits):
        mask = shift_left(loss_mask, 2 + i).bool() & shift_left(in_vocab, 1 + i)
        logp = F.log_softmax(lg.float(), dim=-1)
        ce = -(shift_left(p, 1 + i) * logp).sum(-1)
        total = total + STEP_WEIGHT ** i * (ce * mask).sum() / denom
    return total


def _case(seed: int, b: int, t: int, v: int = 300, vd: int = 70, ht: int = 24,
          dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    draft_ids = torch.randperm(v, generator=g)[:vd].sort().values
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[draft_ids] = True
    lm_head = torch.randn(v, ht, generator=g, dtype=dtype)
    hidden = torch.randn(b, t, ht, generator=g, dtype=dtype) * 0.5
    loss_mask = (torch.rand(b, t, generator=g) < 0.7).long()
    loss_mask[-1, t - 3:] = 0  # the last row is "padded"
    hidden[-1, t - 3:] = 0
    return {"draft_ids": draft_ids, "t2d": t2d, "lm_head": lm_head, "hidden": hidden,
            "loss_mask": loss_mask}


def test_target_argmax_is_the_full_vocab_argmax() -> None:
    c = _case(0, 3, 50, v=1000)
    want = (c["hidden"] @ c["lm_head"].T).argmax(-1)
    for rows, cols in ((4096, 32768), (7, 64), (1, 999)):
        assert torch.equal(target_argmax(c["hidden"], c["lm_head"], rows, cols), want)
    # ties go to the first index, across blocks too
    head = torch.zeros(10, 4)
    head[3, 0] = head[8, 0] = 1.0
    assert target_argmax(torch.ones(2, 4), head, cols=5).tolist() == [3, 3]


def test_target_distribution_equals_the_full_vocab_path() -> None:
    c = _case(1, 2, 40)
    p_ref, top_ref, inv_ref = reference_target(c["hidden"], c["lm_head"], c["draft_ids"],
                                               c["t2d"])
    top = target_argmax(c["hidden"], c["lm_head"])
    p, inv = target_distribution(c["hidden"], draft_head(c["lm_head"], c["draft_ids"]), top,
                                 c["t2d"])
    assert torch.equal(top, top_ref) and torch.equal(inv, inv_ref)
    torch.testing.assert_close(p, p_ref, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("b", "t", "k"), [(1, 40, 3), (3, 33, 7), (2, 5, 7)])
def test_loss_and_gradients_equal_the_reference(dtype: torch.dtype, b: int, t: int, k: int
                                                ) -> None:
    """Loss and the gradient of every step's logits, batch rows of equal width with padding,
    and T shorter than K (steps with no valid position at all)."""
    c = _case(2 + b + t, b, t, dtype=dtype)
    vd = c["draft_ids"].numel()
    p, top, in_vocab = reference_target(c["hidden"], c["lm_head"], c["draft_ids"], c["t2d"])
    p = p.to(dtype)
    g = torch.Generator().manual_seed(9)
    # logits correlated with p, so some drafts are right and tau is not trivial
    base = [torch.log(shift_left(p, 1 + i) + 1e-3) + 0.5 * torch.randn(b, t, vd, generator=g,
                                                                      dtype=dtype)
            for i in range(k)]
    d2t = c["draft_ids"] - torch.arange(vd)
    denom = float(max(1, int(c["loss_mask"][:, 2:].sum())))

    def run(fn: object) -> tuple[torch.Tensor, list[torch.Tensor]]:
        lg = [x.clone().requires_grad_(True) for x in base]
        if fn is ttt_loss:
            loss, stats = ttt_loss(lg, p, top, in_vocab, c["loss_mask"], d2t, denom)
            assert t < 10 or stats[:k].sum() > 0  # a real loss, except in the tiny case
        else:
            loss = reference_loss(lg, p, in_vocab, c["loss_mask"], denom)
        loss.backward()
        return loss.detach(), [x.grad for x in lg]  # type: ignore[misc]

    got, g_got = run(ttt_loss)
    want, g_want = run(reference_loss)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    gtol = max(tol, 1e-6)  # both take log_softmax's backward in float32 (logits.float())
    for i, (x, y) in enumerate(zip(g_got, g_want, strict=True)):
        torch.testing.assert_close(x, y, rtol=gtol, atol=gtol, msg=f"step {i}")


@pytest.mark.parametrize(("k", "gather"), [(1, 1024), (3, 1024), (3, 7)])
def test_logits_of_the_loss_rows_only_equal_the_full_logits_path(
        k: int, gather: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ttt_forward(rows=step_rows(..))` + `ttt_loss(rows=)` (logits only where a step's loss
    reads) against full logits: the same loss and stats, the same gradients of every trained
    weight, on a real drafter with GQA, right padding, prompt tokens and out-of-vocab targets;
    p's rows gathered in one block or in many (`gather`)."""
    from engine.model import ttt_loss as mod
    from engine.model.draft import Eagle3Draft, preset
    monkeypatch.setattr(mod, "GATHER_ROWS", gather)
    torch.manual_seed(3)
    b, t, v, vd, h = 3, 37, 300, 70, 32
    cfg = preset("tiny").with_(hidden_size=h, intermediate_size=64, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=8, target_hidden_size=24,
                               vocab_size=v, draft_vocab_size=vd)
    draft = Eagle3Draft(cfg)
    c = _case(11, b, t, v=v, vd=vd)
    draft.d2t.copy_(c["draft_ids"] - torch.arange(vd))
    draft.t2d.copy_(c["t2d"])
    top = target_argmax(c["hidden"], c["lm_head"])
    p, in_vocab = target_distribution(c["hidden"], draft_head(c["lm_head"], c["draft_ids"]), top,
                                      c["t2d"])
    att = torch.ones(b, t, dtype=torch.long)
    att[-1, t - 3:] = 0  # _case pads the last row's tail
    aux = torch.randn(b, t, 3 * 24)
    ids = torch.randint(0, v, (b, t))
    denom = float(int(c["loss_mask"][:, 2:].sum()))

    def run(rows: list[torch.Tensor] | None) -> tuple[torch.Tensor, ...]:
        draft.zero_grad()
        out = draft.ttt_forward(aux, ids, k, attention_mask=att, rows=rows)
        loss, stats = ttt_loss(out, p, top, in_vocab, c["loss_mask"], draft.d2t, denom, rows)
        loss.backward()
        grads = [q.grad.clone() for q in draft.parameters() if q.grad is not None]
        return loss.detach(), stats, *grads

    rows = step_rows(c["loss_mask"], in_vocab, k)
    assert 0 < rows[0].numel() < b * t  # some positions are skipped, some kept
    full, sparse = run(None), run(rows)
    assert len(full) == len(sparse) > 8
    torch.testing.assert_close(sparse[0], full[0], rtol=1e-6, atol=1e-6)
    assert torch.equal(sparse[1][k:], full[1][k:])  # counts, right drafts, chain: exact
    for x, y in zip(sparse[2:], full[2:], strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # the kept rows are the full path's rows
        dense = draft.ttt_forward(aux, ids, k, attention_mask=att)
        some = draft.ttt_forward(aux, ids, k, attention_mask=att, rows=rows)
    for i in range(k):
        torch.testing.assert_close(some[i], dense[i].reshape(-1, vd)[rows[i]])
