"""torchrun --nproc-per-node 2 (gloo on CPU) trains the same as one process on the same batches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine_helpers import REPO, engine_env, events, run_engine, step_metrics, train_args

pytest_plugins = ("tests.demo_workspace",)

STEPS = 4
COMMON = ["--max-steps", str(STEPS), "--holdout", "0", "--save-every", "2", "--batch-tokens", "512"]


def torchrun(*args: str) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", "-m", "engine", *args],
                       cwd=REPO, env=engine_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    return p


@pytest.fixture(scope="module")
def single(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One process, 2 accumulated micro-batches per step: the same global batch as 2 ranks x 1."""
    out = tmp_path_factory.mktemp("single") / "run"
    run_engine(*train_args(demo_dir, out, *COMMON, "--grad-accum", "2"))
    return out


def compare(single: Path, dist: Path) -> None:
    want, got = step_metrics(single / "events.jsonl"), step_metrics(dist / "events.jsonl")
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    for step in want:
        assert len(got[step]) == 1  # rank 0 alone writes events
        a, b = want[step][0], got[step][0]
        for key in ("loss", "loss_0", "loss_3", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (step, key)
        for key in ("acc_0", "acc_3", "tau", "tokens"):
            assert b[key] == pytest.approx(a[key], abs=1e-9), (step, key)


@pytest.mark.slow
def test_ddp_two_ranks_match_one_process(demo_dir: Path, single: Path, tmp_path: Path) -> None:
    out = tmp_path / "ddp"
    p = torchrun(*train_args(demo_dir, out, *COMMON, "--events"))
    compare(single, out)
    info = json.loads((out / "run.json").read_text())
    assert info["world_size"] == 2 and info["status"] == "done"
    stdout_events = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert sum(e["kind"] == "result" for e in stdout_events) == 1
    assert len(stdout_events) == len(events(out / "events.jsonl"))
    assert (out / "final" / "model.safetensors").is_file()


@pytest.mark.slow
def test_fsdp_two_ranks_match_one_process(demo_dir: Path, single: Path, tmp_path: Path) -> None:
    out = tmp_path / "fsdp"
    torchrun(*train_args(demo_dir, out, *COMMON, "--fsdp"))
    compare(single, out)
    assert (out / "checkpoints" / "step_000004" / "optimizer.pt").is_file()
    rewind_and_resume(demo_dir, out, "--fsdp")


def rewind_and_resume(demo_dir: Path, out: Path, *extra: str) -> None:
    """Point `latest` back at step 2 and resume: steps 3-4 come out bit for bit the same."""
    (out / "checkpoints" / "latest").write_text("step_000002\n")
    torchrun(*train_args(demo_dir, out, *COMMON, *extra, "--resume"))
    got = step_metrics(out / "events.jsonl")
    for step in (3, 4):
        first, again = got[step]
        assert first == {**again, **{k: first[k] for k in first if k.startswith(("t_", "tok",
                                                                             "step_time"))}}
