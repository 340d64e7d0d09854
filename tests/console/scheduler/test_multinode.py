"""A two-node run: two host entries that both reach the test sshd (each with its own root), a
gloo all_reduce under torchrun with a c10d rendezvous on the first, one run id, one record per
node and a combined status; stop takes every node down."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from console.hosts.host import HostPool
from console.runs.service import find_run, launch, stop_run
from console.scheduler.registry import Run
from console.settings.config import Config, HostConfig, Profile
from tests.sshd import SSHD

ALL_REDUCE = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} sum {t.item()}", flush=True)
dist.destroy_process_group()
"""


def two_nodes(sshd: SSHD, tmp_path: Path, profile: Profile) -> Config:
    def node(name: str) -> HostConfig:
        return HostConfig(name=name, ssh=sshd.target, known_hosts=str(sshd.known_hosts),
                          identity=str(sshd.user_key), python=sys.executable,
                          root=str(tmp_path / f"root {name}"))
    return Config(hosts={"gpu1": node("gpu1"), "gpu2": node("gpu2")}, profiles={"p": profile})


async def wait_run(config: Config, run_id: str, pool: HostPool, timeout: float) -> Run:
    deadline = time.monotonic() + timeout
    while True:
        run = Run(run_id, [r for _, r in await find_run(config, run_id, pool)])
        if run.status != "running" or time.monotonic() > deadline:
            return run
        await asyncio.sleep(0.5)


@pytest.mark.slow  # four torch imports (two agents, two workers) on a shared 2-core box
async def test_two_node_gloo_all_reduce(sshd: SSHD, tmp_path: Path) -> None:
    script = tmp_path / "all_reduce.py"
    script.write_text(ALL_REDUCE)
    cfg = two_nodes(sshd, tmp_path, Profile(
        name="p", hosts=["gpu1", "gpu2"], run=f"python {script}",
        env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}))
    pool = HostPool(cfg)
    try:
        started = await launch(cfg, "p", pool)
        assert [r.host for r in started.records] == ["gpu1", "gpu2"]
        assert {r.id for r in started.records} == {started.id}
        run = await wait_run(cfg, started.id, pool, timeout=90)
    finally:
        await pool.close()
    logs = {r.host: (Path(r.run_dir) / "output.log").read_text() for r in run.records}
    assert run.status == "succeeded", logs
    assert [(r.node_rank, r.nnodes, r.exit_code) for r in run.records] == [(0, 2, 0), (1, 2, 0)]
    argv = list(run.records[1].argv)
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    assert argv[argv.index("--node-rank") + 1] == "1"
    assert argv[argv.index("--rdzv-endpoint") + 1] == run.records[0].to_json()["rendezvous"]
    assert run.records[0].to_json()["rendezvous"].startswith("127.0.0.1:")
    text = "".join(logs.values())
    assert "of 2 sum 3.0" in text and text.count("sum 3.0") == 2


async def test_stop_every_node(sshd: SSHD, tmp_path: Path) -> None:
    cfg = two_nodes(sshd, tmp_path, Profile(name="p", hosts=["gpu1", "gpu2"],
                                            run="sh -c 'sleep 300'", env={"MASTER_PORT": "1"}))
    # a non-Python command still goes through torchrun (--no-python); stop it before it matters
    pool = HostPool(cfg)
    try:
        started = await launch(cfg, "p", pool)
        stopped = await stop_run(cfg, started.id, pool, grace=2)
    finally:
        await pool.close()
    assert [r.status for r in stopped.records] == ["stopped", "stopped"]
    assert stopped.status == "stopped"
