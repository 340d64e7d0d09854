"""Detached runs in tests: one host `box` on this machine or on the test sshd, its config as a
file, and waiting for a run to reach a status."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from console.hosts.host import Host
from console.runs.service import list_runs
from console.scheduler.run_record import RunRecord
from console.settings.config import Config, HostConfig, Profile
from tests.sshd import SSHD


def make_config(sshd: SSHD | None, tmp_path: Path, profiles: dict[str, Profile]) -> Config:
    """One host "box": this machine (LocalTransport), or the test sshd when given."""
    root = str(tmp_path / "host root")
    if sshd is None:
        box = HostConfig(name="box", ssh=None, python=sys.executable, root=root)
    else:
        box = HostConfig(name="box", ssh=sshd.target, known_hosts=str(sshd.known_hosts),
                         identity=str(sshd.user_key), python=sys.executable, root=root)
    return Config(hosts={"box": box}, profiles=profiles)


def local_toml(tmp_path: Path, profiles: str, python: str = sys.executable) -> Path:
    """A config file: host `box` on this machine, then `profiles` (TOML)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[hosts.box]\npython = "{python}"\nroot = "{tmp_path / "host root"}"\n'
                   + profiles)
    return cfg


async def wait_status(host: Host, run_id: str, want: set[str], timeout: float = 30) -> RunRecord:
    deadline = time.monotonic() + timeout
    while True:
        recs = await list_runs(host, run_id)
        if recs and recs[0].status in want:
            return recs[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} stuck at {recs[0].status if recs else None}")
        await asyncio.sleep(0.2)
