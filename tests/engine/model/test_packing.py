"""Packed rows (engine/model/packing.py): samples of very different lengths side by side in one
row give the loss, the stats and the gradient of every weight that the same samples give one per
row (right-padded, the split attention), on a real drafter."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.model.packing import same_segment, segment_positions
from engine.model.ttt_loss import (
    TargetSide,
    draft_head,
    step_rows,
    target_argmax,
    ttt_loss_fused,
)

pytest_plugins = ("tests.demo_workspace",)

V, VD, HT = 300, 70, 24


def test_positions_restart_and_pairs_stay_in_their_sample() -> None:
    seg = torch.tensor([[0, 0, 0, 1, 2, 2, 3, 3]])
    assert segment_positions(seg).tolist() == [[0, 1, 2, 0, 0, 1, 0, 1]]
    assert same_segment(seg, 1).tolist() == [[1, 1, 0, 0, 1, 0, 1, 0]]
    assert same_segment(seg, 2).tolist() == [[1, 0, 0, 0, 0, 0, 0, 0]]


def _samples(lengths: list[int], seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        loss_mask = (torch.rand(n, generator=g) < 0.8).long()
        loss_mask[: n // 4] = 0  # a prompt
        out.append({"aux": torch.randn(n, 3 * HT, generator=g),
                    "ids": torch.randint(0, V, (n,), generator=g),
                    "hidden": torch.randn(n, HT, generator=g), "loss_mask": loss_mask})
    return out


def _batch(samples: list[dict[str, torch.Tensor]], packed: bool) -> dict[str, torch.Tensor]:
    if packed:
        b = {k: torch.cat([s[k] for s in samples])[None] for k in samples[0]}
        b["segments"] = torch.cat([torch.full((len(s["ids"]),), i)
                                   for i, s in enumerate(samples)])[None]
        b["att"] = torch.ones_like(b["ids"])
        return b
    t = max(len(s["ids"]) for s in samples)
    b = {}
    for k in samples[0]:
        rows = [torch.cat([s[k], s[k].new_zeros(t - len(s[k]), *s[k].shape[1:])])
                for s in samples]
        b[k] = torch.stack(rows)
    b["att"] = torch.stack([(torch.arange(t) < len(s["ids"])).long() for s in samples])
    return b


@pytest.mark.parametrize("attn_impl", ["split", "dense"])
@pytest.mark.parametrize("norm_output, layer", [(False, "llama"), (True, "llama"),
                                                (False, "mla")])
def test_packed_rows_equal_one_sample_per_row(norm_output: bool, layer: str,
                                              attn_impl: str) -> None:
    """Packed rows through the split attention (one causal kernel call per sample) or the dense
    block-diagonal mask; the rows one sample each always through the split one. The Llama layer
    and the MLA one (yarn)."""
    from engine.model.draft import Eagle3Draft, preset
    torch.manual_seed(7)
    k = 3
    sizes = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 8} if layer == "llama" else {}
    cfg = preset("tiny" if layer == "llama" else "tiny-mla").with_(
        **sizes, target_hidden_size=HT, vocab_size=V, draft_vocab_size=VD,
        norm_output=norm_output)
    draft = Eagle3Draft(cfg)
    g = torch.Generator().manual_seed(1)
    draft_ids = torch.randperm(V, generator=g)[:VD].sort().values
    draft.d2t.copy_(draft_ids - torch.arange(VD))
    draft.t2d.zero_()
    draft.t2d[draft_ids] = True
    lm_head = torch.randn(V, HT, generator=g)
    lm_head[draft_ids] *= 3  # most argmaxes in the draft vocab: most positions supervised
    head_d = draft_head(lm_head, draft_ids)
    samples = _samples([3, 41, 9, 2, 27], seed=2)
    denom = float(sum(int(s["loss_mask"][2:].sum()) for s in samples))

    def run(packed: bool) -> list[torch.Tensor]:
        draft.attn_impl = attn_impl if packed else "split"
        b = _batch(samples, packed)
        seg = b.get("segments")
        top = target_argmax(b["hidden"], lm_head)
        in_vocab = draft.t2d[top]
        rows = step_rows(b["loss_mask"], in_vocab, k, seg)
        draft.zero_grad()
        states = draft.ttt_forward(b["aux"], b["ids"], k, attention_mask=b["att"], rows=rows,
                                   head=False, segments=seg)
        loss, stats = ttt_loss_fused(states, draft.lm_head.weight,
                                     TargetSide(b["hidden"], head_d, top, in_vocab),
                                     b["loss_mask"], draft.d2t, denom, rows, 16, seg)
        loss.backward()
        return [loss.detach(), stats, *(q.grad for q in draft.parameters() if q.grad is not None)]

    packed, single = run(True), run(False)
    assert single[1][k:2 * k].sum() > 0 and single[1][2 * k:3 * k].min() > 10  # real counts
    assert torch.equal(packed[1][k:], single[1][k:])  # counts, right drafts, chain, step-0 total
    torch.testing.assert_close(packed[1][:k], single[1][:k], rtol=1e-5, atol=1e-6)
    assert len(packed) == len(single) > 8
    for x, y in zip([packed[0], *packed[2:]], [single[0], *single[2:]], strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_plan_packs_rows_within_the_budget() -> None:
    from engine.training.plan import epoch_steps, micro_batches
    lengths = [5, 300, 40, 41, 7, 120, 600, 2, 90]
    micro = micro_batches(list(range(len(lengths))), lengths, 128, packed=True)
    assert [i for m in micro for i in m] == list(range(len(lengths)))  # each sample once
    assert all(sum(lengths[i] for i in m) <= 128 or len(m) == 1 for m in micro)
    assert micro[1] == (1,) and (6,) in micro  # a longer sample alone
    a = epoch_steps(list(range(9)), lengths, 256, 2, 3, 1, packed=True)
    assert a == epoch_steps(list(range(9)), lengths, 256, 2, 3, 1, packed=True)  # resumable


def _trainer(demo: Path, out: Path, **kw: Any) -> Any:
    from engine.dist import Dist
    from engine.events import Emitter
    from engine.training.config import TrainConfig
    from engine.training.train import Trainer
    info = json.loads((demo / "demo.json").read_text(encoding="utf-8"))
    cfg = TrainConfig(target=str(demo / "target"), data=str(demo / "data"), out=str(out),
                      draft_vocab_size=info["draft_vocab_size"], ttt_steps=4, epochs=1,
                      save_every=0, holdout=0, **kw)
    tr = Trainer(cfg, Dist(), Emitter("train", out=io.StringIO(), err=io.StringIO()), ["test"])
    tr.setup()
    return tr


def test_packed_demo_batch_equals_the_padded_one(demo_dir: Path, tmp_path: Path) -> None:
    """The trainer's own micro-batch on demo samples of different lengths: one packed row and the
    padded batch give the same stats and the same gradient of every weight."""
    tr = _trainer(demo_dir, tmp_path / "run")
    lengths = tr.setup_.data.lengths
    idx = tuple(sorted(range(len(lengths)), key=lambda i: lengths[i])[::max(1, len(lengths) // 5)])
    assert max(lengths[i] for i in idx) > 3 * min(lengths[i] for i in idx)
    denom = float(sum(tr.setup_.data.loss_counts[i] for i in idx))

    def run(packed: bool) -> list[torch.Tensor]:
        tr.module.zero_grad()
        stats = tr._micro(idx, denom, grad=True, packed=packed)
        return [stats, *(p.grad.clone() for p in tr.module.parameters() if p.grad is not None)]

    packed, padded = run(True), run(False)
    k = tr.cfg.ttt_steps
    assert padded[0][2 * k] > 0
    assert torch.equal(packed[0][k:], padded[0][k:])
    torch.testing.assert_close(packed[0][:k], padded[0][:k], rtol=1e-5, atol=1e-6)
    for x, y in zip(packed[1:], padded[1:], strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)


def test_pack_tokens_trains(demo_dir: Path, tmp_path: Path) -> None:
    """`train --pack-tokens`: the plan packs rows within the budget, the run trains and records
    the setting (a resume compares it)."""
    tr = _trainer(demo_dir, tmp_path / "run", pack_tokens=700, max_steps=2, lr=3e-3)
    plan = tr.epoch(0)
    lengths = tr.setup_.data.lengths
    assert any(len(m) > 1 for s in plan for m in s.micro)
    assert all(sum(lengths[i] for i in m) <= 700 or len(m) == 1 for s in plan for m in s.micro)
    first = tr.train_step(plan[0])
    assert math.isfinite(first["loss"]) and first["loss"] > 0
    assert tr._settings()["pack_tokens"] == 700


def test_pack_tokens_auto_on_the_cpu_sizes_a_row_and_resume_keeps_the_recorded_one(
        demo_dir: Path, tmp_path: Path) -> None:
    """Unset on a CPU: padded rows. `auto`: a row sized from the free memory, in whole 1024-token
    steps, recorded in the settings; a resumed run's recorded size wins over a new measure."""
    from engine.training.memory_plan import PACK_STEP, resolve_pack
    assert _trainer(demo_dir, tmp_path / "plain").pack is None
    tr = _trainer(demo_dir, tmp_path / "auto", pack_tokens="auto")
    assert tr.pack is not None and tr.pack % PACK_STEP == 0
    assert tr._settings()["pack_tokens"] == tr.pack
    assert any(len(m) > 1 for s in tr.epoch(0) for m in s.micro)
    ck = {"trainer": {"settings": tr._settings() | {"pack_tokens": 3072}}}
    assert resolve_pack(tr.cfg, tr.draft.config, tr.dev, 1, 99, ck, tr.ev) == 3072


@pytest.mark.parametrize(("name", "ranks", "fsdp"), [("llama3-8b", 1, False),
                                                     ("kimi-k2-mla", 8, True)])
def test_auto_pack_tokens_fills_the_memory_it_is_given(name: str, ranks: int, fsdp: bool
                                                      ) -> None:
    """At a real drafter's shape: the chosen row's step (counted on the meta device) fits the
    planned share of the memory and one more 1024-token step would not; more memory never gives
    a shorter row; a device too small for the longest sample is one line naming both figures."""
    from engine.errors import EngineError
    from engine.model.presets import preset
    from engine.training.memory_plan import FILL, GIB, MAX_PACK, PACK_STEP, auto_pack_tokens
    from engine.training.memory_plan import step_memory as mem
    cfg = preset(name)
    rows = [auto_pack_tokens(cfg, 7, gib * GIB, ranks, fsdp, 2048) for gib in (40, 80, 141)]
    assert rows == sorted(rows) and rows[0] < rows[-1], rows
    n = rows[1]
    assert mem(cfg, ranks, n, 7, fsdp)["total_fp32"] <= FILL * 80
    assert n == MAX_PACK or mem(cfg, ranks, n + PACK_STEP, 7, fsdp)["total_fp32"] > FILL * 80
    with pytest.raises(EngineError, match=r"needs about [\d.]+ GiB, the device has 4.0 GiB free"):
        auto_pack_tokens(cfg, 7, 4 * GIB, ranks, fsdp, 8192)


@pytest.mark.parametrize(("args", "want"), [
    (["--pack-tokens", "0"], "--pack-tokens 0: a number of tokens >= 1, auto or off"),
    (["--pack-tokens", "lots"], "--pack-tokens lots: a number of tokens >= 1, auto or off"),
    (["--pack-tokens", "512", "--online"], "--pack-tokens: packs prepared features"),
])
def test_pack_tokens_refusals(demo_dir: Path, tmp_path: Path, args: list[str], want: str
                              ) -> None:
    import subprocess
    import sys
    data = demo_dir / ("conversations/train.jsonl" if "--online" in args else "data")
    r = subprocess.run([sys.executable, "-m", "engine", "train", "--target",
                        str(demo_dir / "target"), "--data", str(data), "--out",
                        str(tmp_path / "run"), *args], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and want in lines[0], r.stderr
    assert not (tmp_path / "run").exists()
