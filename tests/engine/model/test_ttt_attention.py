"""TTT attention without the dense mask (engine/model/ttt_attention.py) against the masked-SDPA
path."""

from __future__ import annotations

import os

import pytest
import torch

from engine.model import ttt_attention as ta
from engine.model.draft import Eagle3Draft, preset, valid_positions
from engine.training.memory_plan import activation_bytes
from tests.ttt_grads import loss_and_grads

TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def _kv(b: int, nkv: int, t: int, hd: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(b, nkv, t, hd, dtype=dtype, requires_grad=True) for _ in range(2))


@pytest.mark.parametrize("kernel", ["native", "math"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("causal", [True, False])
def test_split_attention_matches_dense(kernel: str, dtype: torch.dtype, causal: bool,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Forward and every input's gradient, GQA 8 heads / 4 kv heads, 0..6 diagonal steps."""
    if kernel == "math":
        monkeypatch.setattr(ta, "_use_kernel", lambda q: "math")
    torch.manual_seed(0)
    b, nh, nkv, t, hd = 2, 8, 4, 37, 16
    for n in range(7):
        q = torch.randn(b, nh, t, hd, dtype=dtype, requires_grad=True)
        k0, v0 = _kv(b, nkv, t, hd, dtype)
        diag = [_kv(b, nkv, t, hd, dtype) for _ in range(n)]
        leaves = [q, k0, v0, *(x for kv in diag for x in kv)]
        g = torch.randn(b, nh, t, hd, dtype=dtype)
        got = ta.split_attention(q, k0, v0, diag, causal)  # type: ignore[arg-type]
        want = ta.dense_reference(q, k0, v0, diag, causal)  # type: ignore[arg-type]
        torch.testing.assert_close(got, want, rtol=TOL[dtype], atol=TOL[dtype])
        g_got = torch.autograd.grad((got * g).sum(), leaves)
        g_want = torch.autograd.grad((want * g).sum(), leaves)
        for name, x, y in zip(range(len(leaves)), g_got, g_want, strict=True):
            torch.testing.assert_close(x, y, rtol=TOL[dtype], atol=TOL[dtype], msg=f"grad {name}")


@pytest.mark.parametrize("kernel", ["native", "math"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_packed_spans_equal_each_sample_on_its_own(kernel: str, dtype: torch.dtype,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Packed rows (two rows, samples of 1 to 29 tokens): the output and every gradient equal the
    split attention run on each sample's slice alone, so no key crosses into another sample."""
    from engine.model.packing import segment_spans
    if kernel == "math":
        monkeypatch.setattr(ta, "_use_kernel", lambda q: "math")
    torch.manual_seed(3)
    lengths = [[1, 29, 7], [12, 12, 2, 11]]
    t, nh, nkv, hd = 37, 4, 2, 8
    seg = torch.tensor([[i for i, n in enumerate(row) for _ in range(n)] for row in lengths])
    spans = segment_spans(seg)
    assert spans.items[:3] == ((0, 0, 1), (0, 1, 30), (0, 30, 37)) and len(spans.items) == 7
    for n in (0, 1, 3):
        q = torch.randn(2, nh, t, hd, dtype=dtype, requires_grad=True)
        k0, v0 = _kv(2, nkv, t, hd, dtype)
        diag = [_kv(2, nkv, t, hd, dtype) for _ in range(n)]
        leaves = [q, k0, v0, *(x for kv in diag for x in kv)]
        g = torch.randn(2, nh, t, hd, dtype=dtype)
        got = ta.split_attention(q, k0, v0, diag, spans=spans)  # type: ignore[arg-type]
        want = torch.zeros_like(got)
        for r, a, z in spans.items:
            cut = (slice(r, r + 1), slice(None), slice(a, z))
            want[cut] = ta.split_attention(q[cut], k0[cut], v0[cut],
                                           [(k[cut], v[cut]) for k, v in diag])
        torch.testing.assert_close(got, want, rtol=TOL[dtype], atol=TOL[dtype])
        g_got = torch.autograd.grad((got * g).sum(), leaves)
        g_want = torch.autograd.grad((want * g).sum(), leaves)
        for name, x, y in zip(range(len(leaves)), g_got, g_want, strict=True):
            torch.testing.assert_close(x, y, rtol=TOL[dtype], atol=TOL[dtype], msg=f"grad {name}")


def test_causal_attention_returns_the_log_sum_exp() -> None:
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, 9, 8, dtype=torch.float64) for _ in range(3))
    out, lse = ta.causal_attention(q, k, v)
    s = (q @ k.transpose(-1, -2)) / 8 ** 0.5
    s = s.masked_fill(~torch.ones(9, 9, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(lse, s.logsumexp(-1))
    torch.testing.assert_close(out, torch.softmax(s, -1) @ v)


def _draft(dtype: torch.dtype, seed: int = 0) -> Eagle3Draft:
    cfg = preset("tiny").with_(hidden_size=64, intermediate_size=96, num_attention_heads=8,
                                num_key_value_heads=4, head_dim=8, target_hidden_size=64,
                                vocab_size=80, draft_vocab_size=40)
    torch.manual_seed(seed)
    m = Eagle3Draft(cfg).to(dtype)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
        m.embed_tokens.weight.normal_()
    return m


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_ttt_forward_split_equals_dense_with_padding(dtype: torch.dtype) -> None:
    """The model's unroll, K = 7, GQA, right padding: logits at real positions and every weight's
    gradient agree with the dense-mask path."""
    m = _draft(dtype)
    torch.manual_seed(2)
    b, t, k = 3, 24, 7
    aux = torch.randn(b, t, 3 * 64, dtype=dtype)
    ids = torch.randint(0, 80, (b, t))
    att = torch.ones(b, t, dtype=torch.long)
    att[1, 17:] = 0
    att[2, 9:] = 0
    weights = [torch.randn(b, t, 40, dtype=dtype) for _ in range(k)]
    m.attn_impl = "split"
    got, g_got = loss_and_grads(m, aux, ids, att, k, weights)
    m.attn_impl = "dense"
    want, g_want = loss_and_grads(m, aux, ids, att, k, weights)
    for i in range(k):
        real = att.bool() & valid_positions(t, i)[None]
        assert bool(torch.isfinite(got[i]).all())
        torch.testing.assert_close(got[i][real], want[i][real], rtol=TOL[dtype], atol=TOL[dtype])
    assert g_got.keys() == g_want.keys() and "fc.weight" in g_got
    for name, g in g_got.items():
        torch.testing.assert_close(g, g_want[name], rtol=TOL[dtype], atol=TOL[dtype] * 10,
                                   msg=name)


def test_left_padding_takes_the_dense_path() -> None:
    m = _draft(torch.float64)
    aux = torch.randn(2, 10, 3 * 64, dtype=torch.float64)
    ids = torch.randint(0, 80, (2, 10))
    att = torch.ones(2, 10, dtype=torch.long)
    att[0, :3] = 0  # left padded: not what the split path handles
    assert not m._split(att) and m._split(None) and m._split(torch.ones(2, 10))
    got = m.ttt_forward(aux, ids, 3, attention_mask=att)
    m.attn_impl = "dense"
    want = m.ttt_forward(aux, ids, 3, attention_mask=att)
    for x, y in zip(got, want, strict=True):
        assert torch.equal(x, y)


def test_greedy_chains_are_the_same_on_both_paths() -> None:
    """draft_greedy and draft_greedy_all (evaluation) give the same drafts split or dense."""
    m = _draft(torch.float32, seed=5)
    torch.manual_seed(6)
    b, t, k = 2, 19, 5
    aux = torch.randn(b, t, 3 * 64)
    ids = torch.randint(0, 80, (b, t + 1))
    split_all, split_one = m.draft_greedy_all(aux, ids, k), m.draft_greedy(aux, ids, k)
    m.attn_impl = "dense"
    assert torch.equal(split_all, m.draft_greedy_all(aux, ids, k))
    assert torch.equal(split_one, m.draft_greedy(aux, ids, k))
    assert torch.equal(split_all[:, -1], split_one)


def _compiled_matches_eager(backend: str, checkpoints: tuple[bool, ...], dynamic: bool) -> None:
    m = _draft(torch.float32)
    torch.manual_seed(3)
    b, t, k = 2, 16, 3
    aux = torch.randn(b, t, 3 * 64)
    ids = torch.randint(0, 80, (b, t))
    att = torch.ones(b, t, dtype=torch.long)
    att[1, 12:] = 0
    weights = [torch.randn(b, t, 40) for _ in range(k)]
    want, g_want = loss_and_grads(m, aux, ids, att, k, weights)
    m.compile_step(backend=backend, dynamic=dynamic)
    for ckpt, as_rows in [(c, r) for c in checkpoints for r in (False, True)]:
        m.checkpoint_activations = ckpt
        got, g_got = loss_and_grads(m, aux, ids, att, k, weights, as_rows)
        for i in range(k):
            real = att.bool() & valid_positions(t, i)[None]
            torch.testing.assert_close(got[i][real], want[i][real], rtol=1e-5, atol=1e-5)
        for name, g in g_got.items():
            torch.testing.assert_close(g, g_want[name], rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_compiled_step_traces_and_matches_eager() -> None:
    """--compile: dynamo captures the TTT step, custom attention and loss Functions included
    (aot_eager: the graph capture and autograd without inductor's code generation), with and
    without activation checkpointing. Minutes of tracing on 2 busy cores."""
    import torch._dynamo
    torch._dynamo.reset()
    _compiled_matches_eager("aot_eager", (False, True), dynamic=False)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(not os.environ.get("EAGLE3_LONG_TESTS"),
                    reason="inductor's C++ code generation: about a minute of both CI cores; "
                           "EAGLE3_LONG_TESTS=1 runs it (the aot_eager test above runs always)")
def test_compiled_step_with_inductor_matches_eager() -> None:
    """The same with inductor, the default backend of --compile (C++ code generation on CPU:
    minutes on 2 busy cores)."""
    import torch._dynamo
    torch._dynamo.reset()
    _compiled_matches_eager("inductor", (False,), dynamic=True)


def _saved_bytes(draft: Eagle3Draft, t: int, k: int, packed: bool) -> int:
    """What autograd keeps for the unroll over t tokens (engine/training/memory_plan.py), one
    row or packed samples of 64 tokens."""
    seg = (torch.arange(t) // 64)[None] if packed else None
    return activation_bytes(draft, t, k, segments=seg, loss_rows=False)


@pytest.mark.parametrize("name", ["tiny", "tiny-mla"])
@pytest.mark.parametrize("packed", [False, True])
def test_the_unroll_keeps_memory_linear_in_tokens(name: str, packed: bool) -> None:
    """Split attention, one row or packed samples of 64 tokens: four times the tokens, four times
    what the backward keeps (no [T, T] tensor). The dense mask path, measured the same way, grows
    faster. Packed rows need their segment ids' values (real tensors), one row the shapes only."""
    with torch.device("cpu" if packed else "meta"):
        draft = Eagle3Draft(preset(name))
    a, b = (_saved_bytes(draft, t, 3, packed) for t in (256, 1024))
    assert b == 4 * a, (a, b)
    draft.attn_impl = "dense"
    a, b = (_saved_bytes(draft, t, 3, packed) for t in (256, 1024))
    assert b > 5 * a, (a, b)
