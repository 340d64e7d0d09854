"""The training step's fast paths on the demo workspace: the target argmax prepare stores equals the
one training computes, and the run is the same with it or without it."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine.ckpt.target_weights import load_embedding
from engine.events import Emitter
from engine.model.ttt_loss import target_argmax
from engine.training.config import TrainConfig
from engine.training.train import train

pytest_plugins = ("tests.demo_workspace",)


def _run(demo: Path, data: Path, out: Path, **kw: Any) -> list[dict[str, Any]]:
    info = json.loads((demo / "demo.json").read_text(encoding="utf-8"))
    cfg = TrainConfig(target=str(demo / "target"), data=str(data), out=str(out),
                      draft_vocab_size=info["draft_vocab_size"], max_steps=3, lr=3e-3,
                      batch_tokens=1024, ttt_steps=4, epochs=5, save_every=0, holdout=0, **kw)
    ev = Emitter("train", out=io.StringIO(), err=io.StringIO())
    try:
        train(cfg, ev, argv=["test"])
    finally:
        ev.close()
    lines = (out / "events.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(x)["values"] for x in lines if '"kind":"metric"' in x]


def _numbers(metrics: list[dict[str, Any]]) -> list[dict[str, float]]:
    keep = ("loss", "loss_0", "loss_1", "loss_3", "acc_0", "acc_3", "tau", "grad_norm")
    return [{k: m[k] for k in keep} for m in metrics]


def test_prepared_shards_store_the_target_argmax(demo_dir: Path) -> None:
    head = load_embedding(str(demo_dir / "target"))[1].full()
    shards = sorted((demo_dir / "data").glob("shard_*.safetensors"))
    assert shards
    for path in shards:
        with safe_open(str(path), "pt") as f:
            assert "target_argmax" in f.keys()  # noqa: SIM118
            top, hidden = f.get_tensor("target_argmax"), f.get_tensor("hidden_states")
        assert top.dtype == torch.int32
        assert torch.equal(top.long(), target_argmax(hidden, head.float()))


@pytest.mark.slow
def test_stored_and_computed_argmax_train_alike(demo_dir: Path, tmp_path: Path) -> None:
    """Data without `target_argmax` (older shards, SpecForge data) trains exactly the same."""
    bare = tmp_path / "bare"
    shutil.copytree(demo_dir / "data", bare)
    for path in bare.glob("shard_*.safetensors"):
        with safe_open(str(path), "pt") as f:
            meta = f.metadata()
            tensors = {k: f.get_tensor(k) for k in f.keys() if k != "target_argmax"}  # noqa: SIM118
        save_file(tensors, str(path), metadata=meta)
    stored = _run(demo_dir, demo_dir / "data", tmp_path / "stored")
    computed = _run(demo_dir, bare, tmp_path / "computed")
    assert len(stored) == 3
    assert _numbers(stored) == _numbers(computed)


@pytest.mark.slow
def test_checkpoint_activations_and_frozen_lm_head(demo_dir: Path, tmp_path: Path) -> None:
    """--checkpoint-activations recomputes the layer: the same numbers. --freeze-lm-head keeps
    lm_head at its start (the scratch init of the same seed) while the rest trains; both flags
    are recorded in run.json and in the export's provenance."""
    from engine.ckpt.checks import load_drafter
    plain = _run(demo_dir, demo_dir / "data", tmp_path / "plain")
    ckpt = _run(demo_dir, demo_dir / "data", tmp_path / "ckpt", checkpoint_activations=True)
    assert _numbers(ckpt) == _numbers(plain)
    frozen = _run(demo_dir, demo_dir / "data", tmp_path / "frozen", freeze_lm_head=True)
    assert _numbers(frozen) != _numbers(plain)
    _, sd_plain, _ = load_drafter(tmp_path / "plain" / "final")
    _, sd_frozen, _ = load_drafter(tmp_path / "frozen" / "final")
    info = json.loads((demo_dir / "demo.json").read_text(encoding="utf-8"))
    cfg = TrainConfig(target=str(demo_dir / "target"), data=str(demo_dir / "data"),
                      out=str(tmp_path / "x"), draft_vocab_size=info["draft_vocab_size"])
    from engine.training.setup import build
    start = build(cfg, Emitter("t", out=io.StringIO(), err=io.StringIO()),
                  torch.device("cpu")).draft.trainable_state_dict()
    dtype = sd_frozen["lm_head.weight"].dtype
    assert torch.equal(sd_frozen["lm_head.weight"], start["lm_head.weight"].to(dtype))
    assert not torch.equal(sd_plain["lm_head.weight"], start["lm_head.weight"].to(dtype))
    assert not torch.equal(sd_frozen["fc.weight"], start["fc.weight"].to(dtype))
    run = json.loads((tmp_path / "frozen" / "run.json").read_text(encoding="utf-8"))
    assert run["settings"]["freeze_lm_head"] is True
    prov = json.loads((tmp_path / "ckpt" / "final" / "provenance.json").read_text("utf-8"))
    assert prov["training"]["checkpoint_activations"] is True
    assert prov["training"]["freeze_lm_head"] is False
