"""train on the demo workspace: acceptance goes up, finetuning a public drafter is a head start,
vocab remap re-indexes lm_head rows, and the run directory holds what the console reads."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.ckpt.checks import load_drafter
from engine.ckpt.drafter_save import save_drafter
from engine.demo.workspace import FINETUNE_STEPS
from engine.errors import EngineError
from engine.events import Emitter
from engine.training.config import TrainConfig
from engine.training.setup import build
from tests.engine_helpers import events, run_engine, step_metrics, train_args

pytest_plugins = ("tests.demo_workspace",)

SCRATCH_STEPS = FINETUNE_STEPS  # the scratch and the finetune run: equal steps, the demo's


def evaluate(demo: Path, draft: Path, samples: int = 16) -> dict[str, Any]:
    p = run_engine("eval", "--draft", str(draft), "--target", str(demo / "target"),
                   "--data", str(demo / "eval"), "--steps", "3", "--max-samples", str(samples),
                   "--json")
    return dict(json.loads(p.stdout))


def quiet() -> Emitter:
    return Emitter("train", out=io.StringIO(), err=io.StringIO())


@pytest.fixture(scope="module")
def scratch(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's scratch run as its user starts it (a new drafter: EAGLE 3.1, the default)."""
    out = tmp_path_factory.mktemp("scratch") / "run"
    run_engine(*train_args(demo_dir, out, "--max-steps", str(SCRATCH_STEPS)), timeout=600)
    return out


@pytest.fixture(scope="module")
def finetune(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's finetune from its public drafter, as many steps as the scratch run."""
    out = tmp_path_factory.mktemp("finetune") / "run"
    run_engine(*train_args(demo_dir, out, "--max-steps", str(SCRATCH_STEPS), "--rebuild-vocab",
                           "--finetune-from", str(demo_dir / "public-drafter")), timeout=600)
    return out


def untrained_drafter(demo: Path, info: dict[str, Any], dst: Path) -> Path:
    """The scratch run's starting point (same seed), saved EAGLE style."""
    cfg = TrainConfig(target=str(demo / "target"), data=str(demo / "data"), out=str(dst) + "-run",
                      draft_vocab_size=info["draft_vocab_size"], seed=0, eagle_version="3.0")
    draft = build(cfg, quiet(), torch.device("cpu")).draft
    save_drafter(dst, draft.config, draft.trainable_state_dict(), "eagle")
    return dst


@pytest.mark.slow
def test_training_raises_acceptance_length(demo_dir: Path, demo_info: dict[str, Any],
                                           scratch: Path, tmp_path: Path) -> None:
    before = evaluate(demo_dir, untrained_drafter(demo_dir, demo_info, tmp_path / "untrained"))
    after = evaluate(demo_dir, scratch / "final")
    assert before["acceptance_length"] < 1.3
    assert after["acceptance_length"] > before["acceptance_length"] + 0.8, (before, after)
    assert after["per_position"][0] > 0.5


@pytest.mark.slow
def test_finetune_from_the_public_drafter_beats_scratch_at_equal_steps(
        demo_dir: Path, demo_info: dict[str, Any], scratch: Path, finetune: Path,
        tmp_path: Path) -> None:
    """What the demo shows its user: the public drafter is a trained one (far above an untrained
    drafter), finetuning it beats training from scratch for as many steps, on the held-out set,
    each drafter its own default flavour; and the finetune has the public drafter's shapes and
    flags, so a server that runs one takes the other (swap)."""
    tau = {name: evaluate(demo_dir, path, samples=demo_info["samples"]["eval"])
           ["acceptance_length"]
           for name, path in (("untrained", untrained_drafter(demo_dir, demo_info,
                                                              tmp_path / "untrained")),
                              ("public", demo_dir / "public-drafter"),
                              ("scratch", scratch / "final"), ("finetune", finetune / "final"))}
    assert tau["public"] > tau["untrained"] + 2.0, tau
    assert tau["finetune"] > tau["scratch"] + 0.2, tau
    assert tau["finetune"] > tau["public"], tau
    info = json.loads((finetune / "run.json").read_text())
    remap = info["finetune"]["vocab_remap"]
    assert info["finetune"]["format"] == "eagle" and remap["new"] > 0 and remap["kept"] > 0
    src_files = info["finetune"]["sha256"]
    assert list(src_files) == ["model.safetensors"] and len(src_files["model.safetensors"]) == 64
    (pub_cfg, pub, _), (ft_cfg, ft, _) = (load_drafter(d) for d in (
        demo_dir / "public-drafter", finetune / "final"))
    assert {k: v.shape for k, v in ft.items()} == {k: v.shape for k, v in pub.items()}
    assert ((ft_cfg.draft_vocab_size, ft_cfg.norm_before_fc, ft_cfg.norm_output)
            == (pub_cfg.draft_vocab_size, pub_cfg.norm_before_fc, pub_cfg.norm_output))
    assert not torch.equal(ft["d2t"], pub["d2t"])  # the same size, other tokens: remapped


def test_vocab_remap_moves_rows_by_target_id(demo_dir: Path, demo_info: dict[str, Any],
                                             tmp_path: Path) -> None:
    pub_cfg, pub, _ = load_drafter(demo_dir / "public-drafter")
    cfg = TrainConfig(target=str(demo_dir / "target"), data=str(demo_dir / "data"),
                      out=str(tmp_path / "run"), finetune_from=str(demo_dir / "public-drafter"),
                      rebuild_vocab=True, draft_vocab_size=demo_info["draft_vocab_size"])
    setup = build(cfg, quiet(), torch.device("cpu"))
    draft = setup.draft
    assert draft.config.draft_vocab_size == demo_info["draft_vocab_size"]
    old = {int(t): r for r, t in enumerate(pub["d2t"] + torch.arange(pub["d2t"].numel()))}
    new_ids = draft.d2t + torch.arange(draft.d2t.numel())
    assert torch.equal(draft.t2d.nonzero().flatten(), new_ids)
    moved = fresh = 0
    for row, tid in enumerate(new_ids.tolist()):
        if tid in old:  # a trained row follows its token to its new index
            assert torch.equal(draft.lm_head.weight[row], pub["lm_head.weight"][old[tid]].float())
            moved += row != old[tid]
        else:  # a token new to the draft vocab starts from the target's own lm_head row
            assert torch.equal(draft.lm_head.weight[row], setup.lm_head.full()[tid])
            fresh += 1
    assert moved > 0 and fresh > 0
    # the rest of the drafter is the public one, key for key
    for k, v in pub.items():
        if k not in ("lm_head.weight", "d2t", "t2d"):
            assert torch.equal(draft.state_dict()[k], v.float()), k


def test_finetune_from_speculators_style_is_the_same_start(demo_dir: Path, tmp_path: Path
                                                           ) -> None:
    spec = tmp_path / "spec"
    run_engine("convert", str(demo_dir / "public-drafter"), str(spec), "--to", "speculators",
               "--verifier", str(demo_dir / "target"))
    assert "layers.0.self_attn.q_proj.weight" in (spec / "model.safetensors").read_bytes().decode(
        "latin-1")
    starts = []
    for src in (demo_dir / "public-drafter", spec):
        cfg = TrainConfig(target=str(demo_dir / "target"), data=str(demo_dir / "data"),
                          out=str(tmp_path / "run"), finetune_from=str(src))
        starts.append(build(cfg, quiet(), torch.device("cpu")).draft.state_dict())
    assert starts[0].keys() == starts[1].keys()
    for k in starts[0]:
        assert torch.equal(starts[0][k], starts[1][k]), k


def test_run_directory(scratch: Path, demo_dir: Path) -> None:
    info = json.loads((scratch / "run.json").read_text())
    assert info["status"] == "done" and info["world_size"] == 1 and info["step"] == SCRATCH_STEPS
    assert info["argv"][1] == "train" and "--max-steps" in info["argv"]
    for key in ("engine", "started", "ended", "data_sha256", "vocab_sha256", "final_metrics"):
        assert info[key], key
    assert info["finetune"] is None
    evs = events(scratch / "events.jsonl")
    metrics = step_metrics(scratch / "events.jsonl")
    assert sorted(metrics) == list(range(1, SCRATCH_STEPS + 1))
    want = {"loss", "tau", "lr", "grad_norm", "tokens_per_s"} | {
        f"{m}_{i}" for m in ("loss", "acc") for i in range(4)}
    assert want <= set(metrics[SCRATCH_STEPS][0])
    lrs = [metrics[s][0]["lr"] for s in sorted(metrics)]
    assert max(lrs) == pytest.approx(3e-3) and lrs[-1] < lrs[len(lrs) // 2] < max(lrs)
    prog = [e for e in evs if e["kind"] == "progress" and e["desc"] == "train"]
    assert prog[-1]["done"] == prog[-1]["total"] == SCRATCH_STEPS
    assert any(e["eta_s"] is not None for e in prog)
    kept = sorted(p.name for p in (scratch / "checkpoints").iterdir())
    saved = sorted({*range(50, SCRATCH_STEPS + 1, 50), SCRATCH_STEPS})  # and the last step's
    assert kept == ["latest", *(f"step_{s:06d}" for s in saved)]
    cfg, sd, det = load_drafter(scratch / "final")
    assert det.format == "eagle" and "embed_tokens.weight" not in sd
    assert any(k.startswith("midlayer.") for k in sd)
    best = json.loads((scratch / "best" / "provenance.json").read_text())
    assert best["estimated_tau"] == info["best"]["estimated_tau"] > 1.5


def test_bad_inputs_are_one_line(demo_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-target"
    shutil.copytree(demo_dir / "target", other)
    conf = json.loads((other / "config.json").read_text())
    conf["rms_norm_eps"] = 1e-6
    (other / "config.json").write_text(json.dumps(conf))
    p = run_engine("train", "--target", str(other), "--data", str(demo_dir / "data"),
                   "--out", str(tmp_path / "r1"), check=False)
    assert p.returncode == 1 and "prepared with another target" in p.stderr.strip()
    p = run_engine("train", "--target", str(demo_dir / "target"), "--data", str(tmp_path),
                   "--out", str(tmp_path / "r2"), check=False)
    err = p.stderr.strip()
    assert p.returncode == 1 and len(err.splitlines()) == 1 and str(tmp_path) in err
    assert "neither manifest.json, SpecForge data_*.ckpt files nor a speculators directory" in err
    with pytest.raises(EngineError, match="--batch-tokens 0: must be >= 1"):
        TrainConfig(target=str(demo_dir / "target"), data=str(demo_dir / "data"), out="x",
                    batch_tokens=0)


def test_online_features_match_prepared_shards(demo_dir: Path, tmp_path: Path) -> None:
    """`--online` computes in the loop what prepare stored: the same losses, step for step."""
    common = ("--max-steps", "3", "--holdout", "0", "--save-every", "0")
    run_engine(*train_args(demo_dir, tmp_path / "off", *common))
    args = train_args(demo_dir, tmp_path / "on", *common, "--online", "--max-len", "512")
    args[args.index("--data") + 1] = str(demo_dir / "conversations" / "train.jsonl")
    run_engine(*args)
    off, on = step_metrics(tmp_path / "off" / "events.jsonl"), \
        step_metrics(tmp_path / "on" / "events.jsonl")
    for step in (1, 2, 3):
        assert on[step][0]["tokens"] == off[step][0]["tokens"]
        assert on[step][0]["loss"] == pytest.approx(off[step][0]["loss"], rel=1e-4)


def test_vocab_file_from_vocab_build(demo_dir: Path, tmp_path: Path) -> None:
    from engine.ckpt.vocab import load_vocab
    vocab = tmp_path / "vocab.safetensors"
    run_engine("vocab", "build", "--data", str(demo_dir / "data"), "--draft-vocab-size", "64",
               "--out", str(vocab))
    args = train_args(demo_dir, tmp_path / "run", "--max-steps", "2", "--holdout", "0",
                      "--vocab", str(vocab))
    at = args.index("--draft-vocab-size")
    del args[at:at + 2]  # the file decides the size
    run_engine(*args)
    d2t, t2d = load_vocab(vocab)
    _, sd, _ = load_drafter(tmp_path / "run" / "final")
    assert torch.equal(sd["d2t"], d2t) and torch.equal(sd["t2d"], t2d)
    assert sd["lm_head.weight"].shape[0] == 64
