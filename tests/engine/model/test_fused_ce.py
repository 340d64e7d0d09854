"""The fused lm_head + soft cross-entropy (engine/model/fused_ce.py, `ttt_loss_fused`) against the
plain loss on full logits (`ttt_loss(rows=)` after the lm_head), at a Kimi target's vocab
(163,840) with its drafter's (32,000) and with the full one as the draft vocab; and its peak
memory, measured in a fresh process (benchmarks/loss_memory.py)."""

from __future__ import annotations

import sys

import pytest
import torch

from engine.model.ttt_loss import (
    STEP_WEIGHT,
    TargetSide,
    draft_head,
    step_rows,
    target_argmax,
    target_distribution,
    ttt_loss,
    ttt_loss_fused,
)
from tests.paths import REPO

KIMI_VOCAB = 163_840
KIMI_DRAFT_VOCAB = 32_000


def _case(vd: int, dtype: torch.dtype, b: int = 2, t: int = 21, h: int = 16, ht: int = 12,
          k: int = 3, v: int = KIMI_VOCAB) -> dict:
    g = torch.Generator().manual_seed(vd + t)
    draft_ids = torch.randperm(v, generator=g)[:vd].sort().values
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[draft_ids] = True
    head = torch.randn(v, ht, generator=g, dtype=dtype)
    hidden = torch.randn(b, t, ht, generator=g, dtype=dtype)
    top = target_argmax(hidden, head)
    assert torch.equal(top, (hidden @ head.T).argmax(-1))  # the chunked argmax at V=163,840
    # The argmax in the draft vocab at most positions, so most positions are supervised.
    in_vocab = t2d[top]
    keep = torch.rand(b, t, generator=g) < 0.8
    top = torch.where(keep | in_vocab, torch.where(in_vocab, top, draft_ids[top % vd]), top)
    in_vocab = t2d[top]
    loss_mask = (torch.rand(b, t, generator=g) < 0.8).long()
    loss_mask[-1, t - 3:] = 0
    rows = step_rows(loss_mask, in_vocab, k)
    assert all(0 < r.numel() < b * t for r in rows)
    n = sum(int(r.numel()) for r in rows)
    states = torch.randn(n, h, generator=g, dtype=dtype)
    w = torch.randn(vd, h, generator=g, dtype=dtype) * 0.5
    # Every other row points at its target's draft id, so some drafts are right.
    want = torch.cat([top.reshape(-1)[r + 1 + i] for i, r in enumerate(rows)])
    d = torch.searchsorted(draft_ids, want)
    states[::2] = 3 * w[d[::2]]
    return {"head_d": draft_head(head, draft_ids), "hidden": hidden, "top": top,
            "in_vocab": in_vocab, "t2d": t2d, "loss_mask": loss_mask, "rows": rows,
            "states": states, "w": w, "d2t": draft_ids - torch.arange(vd),
            "denom": float(int(loss_mask[:, 2:].sum()))}


def _run(c: dict, fused: bool, chunk: int | None = None, train_w: bool = True
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    sizes = [int(r.numel()) for r in c["rows"]]
    x = c["states"].clone().requires_grad_(True)
    w = c["w"].clone().requires_grad_(train_w)
    parts = list(x.split(sizes))
    if fused:
        target = TargetSide(c["hidden"], c["head_d"], c["top"], c["in_vocab"])
        loss, stats = ttt_loss_fused(parts, w, target, c["loss_mask"], c["d2t"], c["denom"],
                                     c["rows"], chunk)
    else:
        p, _ = target_distribution(c["hidden"], c["head_d"], c["top"], c["t2d"])
        loss, stats = ttt_loss([s @ w.T for s in parts], p, c["top"], c["in_vocab"],
                               c["loss_mask"], c["d2t"], c["denom"], c["rows"])
        if c["w"].dtype == torch.float64:  # ttt_loss works in float32: the float64 reference
            th = c["hidden"].reshape(-1, c["hidden"].shape[-1])
            loss = sum(STEP_WEIGHT ** i * -(torch.softmax(th[r + 1 + i] @ c["head_d"].T, -1)
                                            * torch.log_softmax(s @ w.T, -1)).sum()
                       for i, (s, r) in enumerate(zip(parts, c["rows"], strict=True))
                       ) / c["denom"]
    (3.0 * loss).backward()  # a non-unit upstream gradient, as the trainer's world scaling
    return loss.detach(), stats, x.grad, w.grad  # type: ignore[return-value]


# (dtype, rtol = atol). In float32 at V=163,840 the two sum in different orders: they differ by
# about 2e-5 relative, and each is about 2e-4 from the float64 loss of the same inputs.
F64, F32 = (torch.float64, 1e-10), (torch.float32, 1e-4)


@pytest.mark.parametrize(("vd", "dtype", "tol", "chunk"), [
    (KIMI_DRAFT_VOCAB, *F64, None), (KIMI_DRAFT_VOCAB, *F64, 5), (KIMI_DRAFT_VOCAB, *F32, 5),
    (KIMI_VOCAB, *F32, None), (KIMI_VOCAB, *F32, 9)])
def test_fused_loss_and_gradients_equal_the_plain_loss(vd: int, dtype: torch.dtype, tol: float,
                                                       chunk: int | None) -> None:
    """Loss, stats and the gradients of the states and the lm_head, in one chunk or in chunks
    of 5 rows (the chunks cross the steps' boundaries); against `ttt_loss` in float32 and the
    straightforward formula in float64."""
    c = _case(vd, dtype)
    loss, stats, gx, gw = _run(c, fused=True, chunk=chunk)
    loss_p, stats_p, gx_p, gw_p = _run(c, fused=False)
    k = len(c["rows"])
    assert stats[:k].sum() > 0 and stats[k:2 * k].sum() > 0  # a real loss, some drafts right
    torch.testing.assert_close(loss, loss_p, rtol=tol, atol=tol)
    if dtype == torch.float32:
        torch.testing.assert_close(stats[:k], stats_p[:k], rtol=tol, atol=tol)
    assert torch.equal(stats[k:], stats_p[k:])  # counts, right drafts, chain: exact
    torch.testing.assert_close(gx, gx_p, rtol=tol, atol=tol)
    torch.testing.assert_close(gw, gw_p, rtol=tol, atol=tol)


def test_a_frozen_lm_head_and_no_grad() -> None:
    """A frozen lm_head gets no gradient (and none is computed); under no_grad the loss and
    stats are the same."""
    c = _case(KIMI_DRAFT_VOCAB, torch.float64)
    loss, stats, gx, gw = _run(c, fused=True, train_w=False)
    _, _, gx_p, _ = _run(c, fused=False, train_w=False)
    assert gw is None
    torch.testing.assert_close(gx, gx_p, rtol=1e-10, atol=1e-10)
    target = TargetSide(c["hidden"], c["head_d"], c["top"], c["in_vocab"])
    parts = list(c["states"].split([int(r.numel()) for r in c["rows"]]))
    with torch.no_grad():
        loss_ng, stats_ng = ttt_loss_fused(parts, c["w"], target, c["loss_mask"], c["d2t"],
                                           c["denom"], c["rows"])
    assert torch.equal(loss_ng, loss) and torch.equal(stats_ng, stats)


@pytest.mark.parametrize("norm_output", [False, True])
def test_the_drafters_fused_step_equals_its_logits_step(norm_output: bool) -> None:
    """`ttt_forward(head=False)` + `ttt_loss_fused` (the trainer's step) against
    `ttt_forward(rows=)` + `ttt_loss`: the same loss, stats and gradient of every weight, on a
    real drafter with GQA, right padding and out-of-vocab targets."""
    from engine.model.draft import Eagle3Draft, preset
    torch.manual_seed(5)
    b, t, v, vd, k = 3, 29, 300, 70, 3
    cfg = preset("tiny").with_(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=8, target_hidden_size=24,
                               vocab_size=v, draft_vocab_size=vd, norm_output=norm_output)
    draft = Eagle3Draft(cfg)
    c = _case(vd, torch.float32, b=b, t=t, ht=24, k=k, v=v)
    draft.d2t.copy_(c["d2t"])
    draft.t2d.copy_(c["t2d"])
    att = torch.ones(b, t, dtype=torch.long)
    att[-1, t - 3:] = 0
    aux, ids = torch.randn(b, t, 3 * 24), torch.randint(0, v, (b, t))
    p, _ = target_distribution(c["hidden"], c["head_d"], c["top"], c["t2d"])
    target = TargetSide(c["hidden"], c["head_d"], c["top"], c["in_vocab"])

    def run(fused: bool) -> list[torch.Tensor]:
        draft.zero_grad()
        out = draft.ttt_forward(aux, ids, k, attention_mask=att, rows=c["rows"], head=not fused)
        if fused:
            loss, stats = ttt_loss_fused(out, draft.lm_head.weight, target, c["loss_mask"],
                                         draft.d2t, c["denom"], c["rows"], 7)
        else:
            loss, stats = ttt_loss(out, p, c["top"], c["in_vocab"], c["loss_mask"], draft.d2t,
                                   c["denom"], c["rows"])
        loss.backward()
        return [loss.detach(), stats, *(q.grad for q in draft.parameters() if q.grad is not None)]

    got, want = run(True), run(False)
    assert len(got) == len(want) > 8
    torch.testing.assert_close(got[1][:k], want[1][:k], rtol=1e-5, atol=1e-6)
    assert torch.equal(got[1][k:], want[1][k:])
    for x, y in zip([got[0], *got[2:]], [want[0], *want[2:]], strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.component   # measured in fresh processes (benchmarks/loss_memory.py)
def test_peak_memory_does_not_grow_with_tokens_times_vocab() -> None:
    """At V=163,840: the fused loss's peak (forward + backward, the RSS high-water mark over the
    RSS before it, in a fresh process: benchmarks/loss_memory.py, which prints the figure at
    T=8192) is its chunk tensors and the [Vd,H] gradients, at 4x the tokens of a plain loss that,
    measured the same way, holds several [T,V] float32 tensors."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from loss_memory import measure
    vd, elems = KIMI_VOCAB, 1 << 20  # chunk tensors of 4 MiB (the trainer's: 128 MiB)
    plain = measure("plain", 128, vd)
    fused = measure("fused", 512, vd, elems=elems)
    mib = 2**20
    print(f"peak over the inputs at V={vd:,}: plain {plain['peak_mib']:.0f} MiB at T=128, fused "
          f"{fused['peak_mib']:.0f} MiB at T=512; one [T,V] float32 tensor: "
          f"{4 * 128 * vd / mib:.0f} / {4 * 512 * vd / mib:.0f} MiB")
    assert plain["peak_mib"] > 2 * 4 * 128 * vd / mib  # the measure sees [T,V] tensors
    # What it holds is three chunk tensors, dW, the weight's gradient and the backward's
    # product (about 30 MiB here; 10 MiB measured on a quiet machine). The bound is one
    # [128,V] tensor, a quarter of one [512,V]: an RSS high-water mark also counts what the
    # kernel rounds up (52 MiB once in CI), and any [T,V] tensor at T=512 is far above it.
    assert fused["peak_mib"] < 4 * 128 * vd / mib
