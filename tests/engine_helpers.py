"""Helpers for tests that run `python -m engine` as a real subprocess and read its events."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def engine_env(**extra: str) -> dict[str, str]:
    """Environment for `python -m engine` subprocesses: repo importable, one thread per process
    (small models on shared cores: oversubscribed OpenMP threads spin and stall)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.update(extra)
    return env


def run_engine(*args: str, timeout: float = 300, check: bool = True, **kw: Any
               ) -> subprocess.CompletedProcess[str]:
    """Run `python -m engine ARGS` and return the finished process (stdout/stderr as text)."""
    p = subprocess.run([sys.executable, "-m", "engine", *args], cwd=REPO, env=engine_env(),
                       capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"engine {' '.join(args)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return p


def events(path: Path) -> list[dict[str, Any]]:
    """The JSON events of an events.jsonl file; a last line without its newline is still being
    written (or was torn by a kill) and is left out."""
    lines = path.read_text(encoding="utf-8").split("\n")[:-1]
    return [json.loads(line) for line in lines if line]


def step_metrics(path: Path) -> dict[int, list[dict[str, Any]]]:
    """step -> every metric payload logged for it (a resumed run logs some steps twice)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for e in events(path):
        if e["kind"] == "metric":
            out.setdefault(e["step"], []).append(e["values"])
    return out


def train_args(demo: Path, out: Path, *extra: str) -> list[str]:
    """`train` arguments on the demo data with the demo's suggested settings."""
    info = json.loads((demo / "demo.json").read_text(encoding="utf-8"))
    from engine.demo.workspace import TRAIN_ARGS
    return ["train", "--target", str(demo / "target"), "--data", str(demo / "data"),
            "--out", str(out), "--draft-vocab-size", str(info["draft_vocab_size"]),
            *TRAIN_ARGS, *extra]


def kill_after_shards(args: list[str], progress: Path, shards: int = 2,
                      timeout: float = 600) -> list[dict[str, Any]]:
    """Start a capture (`python -m engine prepare ...` argv), SIGKILL it once its resume journal
    `progress` holds `shards` shards, and return the shards it kept. Fails when the capture ended
    before it could be killed."""
    import signal
    import time
    proc = subprocess.Popen(args, cwd=REPO, env=engine_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + timeout
        while time.monotonic() < end and proc.poll() is None:
            if progress.is_file() and len(json.loads(progress.read_text())["shards"]) >= shards:
                break
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the capture ended before it could be killed"
    return list(json.loads(progress.read_text())["shards"])
