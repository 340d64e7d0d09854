"""--resume: a run killed with SIGKILL, then resumed, logs exactly an uninterrupted run's losses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.engine_helpers import REPO, engine_env, events, run_engine, step_metrics, train_args

pytest_plugins = ("tests.demo_workspace",)

STEPS = ["--max-steps", "16", "--save-every", "4", "--holdout", "8", "--keep", "2"]


def wait_for_step(path: Path, step: int, proc: subprocess.Popen[str], timeout: float) -> int:
    """Poll events.jsonl until a metric for `step` (or later) is logged; returns that step."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, "the run ended before it could be killed"
        if path.is_file():
            steps = [e["step"] for e in events(path) if e["kind"] == "metric"]
            if steps and steps[-1] >= step:
                return int(steps[-1])
        time.sleep(0.02)
    raise AssertionError(f"no step {step} within {timeout}s")


@pytest.mark.slow
def test_sigkill_then_resume_reproduces_every_loss(demo_dir: Path, tmp_path: Path) -> None:
    ref, run = tmp_path / "ref", tmp_path / "run"
    run_engine(*train_args(demo_dir, ref, *STEPS))
    proc = subprocess.Popen([sys.executable, "-m", "engine", *train_args(demo_dir, run, *STEPS)],
                            cwd=REPO, env=engine_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        killed_at = wait_for_step(run / "events.jsonl", 9, proc, timeout=240)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert json.loads((run / "run.json").read_text())["status"] == "running"  # no clean exit
    resumed_from = (run / "checkpoints" / "latest").read_text().strip()
    run_engine(*train_args(demo_dir, run, *STEPS, "--resume"))

    want, got = step_metrics(ref / "events.jsonl"), step_metrics(run / "events.jsonl")
    assert sorted(got) == sorted(want) == list(range(1, 17))
    start = int(resumed_from.split("_")[1])
    assert start <= killed_at and len(got[killed_at]) == 2  # this step really ran twice
    for step, logged in got.items():
        for values in logged:  # before the kill and after the resume alike
            for key in ("loss", "loss_0", "loss_3", "acc_0", "acc_3", "tau", "grad_norm", "lr"):
                assert values[key] == want[step][0][key], (step, key)
    logs = [e["msg"] for e in events(run / "events.jsonl") if e["kind"] == "log"]
    assert f"resumed from {run / 'checkpoints' / resumed_from} at step {start}" in logs
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "done" and info["step"] == 16
    kept = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert kept == ["step_000012", "step_000016"]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000016"
    assert not list((run / "checkpoints").glob(".tmp-*"))

    # the same run directory refuses a resume with other settings, and a fresh start
    p = run_engine(*train_args(demo_dir, run, *STEPS, "--lr", "1e-3", "--resume"), check=False)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines()[-1] == (
        f"error: --resume: setting 'lr' is 0.001 but the run in {run} used 0.003")
    p = run_engine(*train_args(demo_dir, run, *STEPS), check=False)
    assert p.returncode == 1 and "holds checkpoints already (pass --resume" in p.stderr
