"""`python -m engine inspect` shows where a drafter came from: the step and
held-out tau of out/best, out/final and a step checkpoint of a real demo finetune, its finetune
source with the sha256 of its weights, the data and vocab hashes, and the same again through
two conversions; the demo's public drafter, like a downloaded one, records nothing."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.drafters import write_drafter
from tests.engine_helpers import REPO, engine_env, events, run_engine

pytest_plugins = ("tests.demo_workspace",)

STEPS = 4


@pytest.fixture(scope="module")
def finetune(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-step demo finetune with a checkpoint every 2 steps and 8 held-out samples."""
    info = json.loads((demo_dir / "demo.json").read_text(encoding="utf-8"))
    out = tmp_path_factory.mktemp("ft") / "run"
    run_engine("train", "--target", str(demo_dir / "target"), "--data", str(demo_dir / "data"),
               "--out", str(out), "--finetune-from", str(demo_dir / "public-drafter"),
               "--rebuild-vocab", "--draft-vocab-size", str(info["draft_vocab_size"]),
               "--max-steps", str(STEPS), "--save-every", "2", "--holdout", "8",
               "--batch-tokens", "1024", "--ttt-steps", "2", "--lr", "3e-3", timeout=600)
    return out


def inspect(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine", "inspect", str(path), *extra],
                          cwd=REPO, env=engine_env(), capture_output=True, text=True, timeout=120)


def held_out(run: Path) -> dict[int, float]:
    """step -> held-out tau, as the run logged it at each checkpoint."""
    taus = {}
    for e in events(run / "events.jsonl"):
        m = re.search(r"checkpoint step_0*(\d+)\b.*held-out tau ([0-9.]+)", e.get("msg", ""))
        if e["kind"] == "log" and m:
            taus[int(m[1])] = float(m[2])
    return taus


def row(text: str, label: str) -> str:
    line = next(ln for ln in text.splitlines() if ln.startswith(label + " "))
    return line[len(label):].strip()


@pytest.mark.slow
def test_best_final_and_a_step_checkpoint_show_their_step_and_held_out_tau(
        finetune: Path, demo_dir: Path) -> None:
    run = json.loads((finetune / "run.json").read_text(encoding="utf-8"))
    taus = held_out(finetune)
    assert sorted(taus) == [2, STEPS]
    sha = hashlib.sha256((demo_dir / "public-drafter" / "model.safetensors").read_bytes())
    cases = {"final": STEPS, "best": run["best"]["step"], "checkpoints/step_000002": 2}
    for sub, step in cases.items():
        r = inspect(finetune / sub)
        assert r.returncode == 0, r.stderr
        assert row(r.stdout, "step").startswith(f"{step} · held-out tau {taus[step]:.3f}"), sub
        assert row(r.stdout, "run") == str(finetune.resolve())
        assert row(r.stdout, "finetune") == (f"{(demo_dir / 'public-drafter').resolve()} "
                                             f"(eagle, sha256 {sha.hexdigest()[:12]})")
        assert row(r.stdout, "hashes") == (f"data sha256 {run['data_sha256'][:12]} · vocab "
                                           f"sha256 {run['vocab_sha256'][:12]}")
        p = json.loads(inspect(finetune / sub, "--json").stdout)["provenance"]
        assert (p["step"], p["data_sha256"], p["vocab_sha256"]) == (
            step, run["data_sha256"], run["vocab_sha256"])
        assert p["finetune"]["sha256"] == sha.hexdigest()
        assert p["held_out_tau"] == pytest.approx(taus[step], abs=5e-4)
    assert "best so far: step" in row(inspect(finetune / "checkpoints/step_000002").stdout,
                                      "step")


@pytest.mark.slow
def test_conversions_keep_the_training_provenance(finetune: Path, tmp_path: Path) -> None:
    first, second = tmp_path / "vllm", tmp_path / "sglang"
    run_engine("convert", str(finetune / "best"), str(first), "--to", "vllm")
    run_engine("convert", str(first), str(second), "--to", "sglang")
    best = json.loads(inspect(finetune / "best", "--json").stdout)["provenance"]
    r = inspect(second)
    assert r.returncode == 0, r.stderr
    p: dict[str, Any] = json.loads(inspect(second, "--json").stdout)["provenance"]
    for k in ("run", "step", "held_out_tau", "data_sha256", "vocab_sha256", "finetune"):
        assert p[k] == best[k], k
    assert p["written_by"] == "convert" and p["format"] == "sglang"
    assert p["derived_from"]["path"] == str(first.resolve())
    assert row(r.stdout, "written by").startswith("convert, sglang style")
    assert row(r.stdout, "from") == f"{first.resolve()} (eagle)"
    assert row(r.stdout, "step") == row(inspect(finetune / "best").stdout, "step")


def test_the_public_drafter_and_a_foreign_drafter(demo_dir: Path, tmp_path: Path) -> None:
    # the demo's public drafter stands for a downloaded one: no record of ours, like a foreign one
    r = inspect(demo_dir / "public-drafter")
    assert r.returncode == 0, r.stderr
    assert row(r.stdout, "provenance") == "none recorded (not written by this engine)"
    write_drafter(tmp_path / "foreign")
    r = inspect(tmp_path / "foreign")
    assert row(r.stdout, "provenance") == "none recorded (not written by this engine)"
    assert json.loads(inspect(tmp_path / "foreign", "--json").stdout)["provenance"] is None
