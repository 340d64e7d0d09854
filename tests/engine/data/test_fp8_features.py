"""FP8 feature storage (engine/data/fp8_store.py): `prepare --fp8` stores the aux and final states
as float8_e4m3fn with per-token scales, readers dequantise them, old data reads as before, the
manifest and the disk estimate know the storage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from engine.data.disk_estimate import estimate_bytes
from engine.data.fp8_store import FP8, SCALE_BYTES_PER_TOKEN, dequantize, quantize
from engine.data.prepare import TOKEN_EXTRA_BYTES, check_disk
from engine.data.readers import open_data
from engine.errors import EngineError
from tests.engine_helpers import run_engine

pytest_plugins = ("tests.demo_workspace",)


def test_quantize_keeps_each_value_within_fp8_rounding() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 3 * 64, generator=g) * torch.tensor([0.01, 1.0, 300.0]).repeat_interleave(
        64)  # three layers of very different size: one scale each
    x[7] = 0.0
    q, s = quantize(x, 3)
    assert q.dtype == FP8 and s.shape == (50, 3) and s.dtype == torch.float32
    back = dequantize(q, s, torch.float32)
    chunk_max = x.reshape(50, 3, 64).abs().amax(-1, keepdim=True)
    err = (back - x).reshape(50, 3, 64).abs()
    # e4m3: 3 mantissa bits -> half an ulp is 2^-4 of the value; subnormals near 0: of the max
    assert bool((err <= x.reshape(50, 3, 64).abs() / 16 + chunk_max / 2**9 + 1e-30).all())
    assert torch.equal(back[7], torch.zeros(192))


@pytest.fixture(scope="module")
def both(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("fp8")
    conv = tmp / "conv.jsonl"
    conv.write_text("".join((demo_dir / "conversations" / "eval.jsonl").read_text()
                            .splitlines(keepends=True)[:12]))
    out: dict[str, Any] = {}
    for name, extra in (("full", ()), ("fp8", ("--fp8",))):
        p = run_engine("prepare", "--target", str(demo_dir / "target"), "--data", str(conv),
                       "--out", str(tmp / name), "--max-len", "256", "--json", *extra)
        out[name] = (tmp / name, json.loads(p.stdout))
    return out


@pytest.mark.slow
def test_prepare_fp8_stores_half_and_reads_back_close(both: dict[str, Any]) -> None:
    (full_dir, full_m), (fp8_dir, fp8_m) = both["full"], both["fp8"]
    assert full_m["storage"] == full_m["dtype"] == "float32"
    assert fp8_m["storage"] == "float8_e4m3fn" and fp8_m["dtype"] == "float32"
    shard = fp8_dir / fp8_m["shards"][0]["file"]
    with safe_open(str(shard), "pt") as f:
        assert f.get_slice("aux_hidden_states").get_dtype() == "F8_E4M3"
        assert f.get_slice("hidden_states").get_dtype() == "F8_E4M3"
        assert f.get_slice("aux_hidden_states_scale").get_shape()[1] == 3
    a, b = open_data(str(full_dir)), open_data(str(fp8_dir))
    assert len(a) == len(b) > 0
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert y.aux.dtype == y.hidden.dtype == torch.float32  # dequantised for the trainer
        assert torch.equal(x.input_ids, y.input_ids)
        assert torch.equal(x.target_argmax, y.target_argmax)  # taken before the rounding
        for u, v in ((x.aux, y.aux), (x.hidden, y.hidden)):
            rel = (u - v).norm(dim=-1) / u.norm(dim=-1)
            assert float(rel.max()) < 0.05
    full_bytes = sum((full_dir / s["file"]).stat().st_size for s in full_m["shards"])
    fp8_bytes = sum((fp8_dir / s["file"]).stat().st_size for s in fp8_m["shards"])
    assert fp8_bytes < 0.3 * full_bytes  # float32 -> 1 byte a value (+ scales, ids)


def test_data_written_before_fp8_reads_as_before(both: dict[str, Any], tmp_path: Path) -> None:
    """A directory from an engine without `storage` in its manifest reads unchanged."""
    import shutil
    full_dir, _ = both["full"]
    old = tmp_path / "old"
    shutil.copytree(full_dir, old)
    m = json.loads((old / "manifest.json").read_text())
    del m["storage"]
    (old / "manifest.json").write_text(json.dumps(m))
    a, b = open_data(str(full_dir)), open_data(str(old))
    for i in range(len(a)):
        assert torch.equal(a[i].aux, b[i].aux) and torch.equal(a[i].hidden, b[i].hidden)


def test_the_disk_estimate_counts_fp8(tmp_path: Path) -> None:
    tokens, hidden = 50_000 * 2048, 7168
    bf16 = estimate_bytes(tokens, 4, hidden, 2)
    fp8 = estimate_bytes(tokens, 4, hidden, 1, TOKEN_EXTRA_BYTES + SCALE_BYTES_PER_TOKEN)
    assert round(bf16 / 1e12, 1) == 5.9 and round(fp8 / 1e12, 1) == 2.9
    with pytest.raises(EngineError, match=r"x 1 bytes \(FP8\) \+ scales"):
        check_disk(str(tmp_path / "out"), 10**15, hidden, torch.bfloat16, fp8=True)
