"""The monitor service with real hosts: the engine's agent through the local transport and over a
real sshd (with a dropped connection), the nvidia-smi fallback when the agent cannot run, and
the staleness/history rules on recorded samples."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
import time
from pathlib import Path

import psutil
import pytest

from console.hosts.host import HostPool
from console.monitor.record import GpuStat, HostStat, Sample
from console.monitor.service import HostMonitor, MonitorHub, MonitorState
from console.settings.config import Config, HostConfig
from tests.paths import FIXTURES
from tests.sshd import SSHD

pytestmark = pytest.mark.timeout(60)

FIX = FIXTURES / "nvidia_smi"


async def _until(pred, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "condition not met in time"
        await asyncio.sleep(0.02)


def _hub(host: HostConfig, interval: float = 0.2) -> MonitorHub:
    return MonitorHub(HostPool(Config(hosts={host.name: host})), interval=interval)


async def test_agent_on_the_local_host(tmp_path: Path) -> None:
    hub = _hub(HostConfig(name="box", python=sys.executable, root=str(tmp_path / "root")))
    mon = hub["box"]
    try:
        hub.watch("box")
        await _until(lambda: mon.version >= 3)
        s = mon.sample
        assert mon.state is MonitorState.LIVE and mon.detail == ""
        assert s is not None and s.source == "engine" and s.gpus == ()
        assert s.reason and "NVML" in s.reason
        assert s.host is not None and len(s.host.cpu) == psutil.cpu_count()
        assert s.host.disk_path == str(tmp_path / "root")
        assert len(mon.host_history) >= 3 and not mon.stale(time.time())
    finally:
        await hub.close()
    assert not [p for p in psutil.Process().children(recursive=True)
                if "monitor" in " ".join(p.cmdline())]


async def test_killed_agent_reconnects_and_keeps_last_data(tmp_path: Path) -> None:
    hub = _hub(HostConfig(name="box", python=sys.executable, root=str(tmp_path / "root")))
    mon = hub["box"]
    try:
        hub.watch("box")
        await _until(lambda: mon.version >= 2)
        agents = [p for p in psutil.Process().children(recursive=True)
                  if "monitor" in " ".join(p.cmdline())]
        assert len(agents) == 1
        last = mon.sample
        agents[0].kill()
        await _until(lambda: mon.state is MonitorState.RECONNECTING, 5)
        assert mon.sample is last and "exited" in mon.detail   # last data kept while down
        await _until(lambda: mon.state is MonitorState.LIVE and mon.sample is not last)
        assert mon.detail == ""
    finally:
        await hub.close()


async def test_fallback_to_nvidia_smi_when_the_agent_cannot_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\ncase \"$1\" in\n"
                    f"  --query-gpu=*) cat {FIX / 'h200x8_vllm.gpu.csv'} ;;\n"
                    f"  --query-compute-apps=*) cat {FIX / 'h200x8_vllm.apps.csv'} ;;\nesac\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    # a host whose Python does not exist: the agent cannot start there
    hub = _hub(HostConfig(name="old", python=str(tmp_path / "no-python"),
                          root=str(tmp_path / "root")))
    mon = hub["old"]
    try:
        hub.watch("old")
        await _until(lambda: mon.sample is not None)
        s = mon.sample
        assert s is not None and s.source == "nvidia-smi" and len(s.gpus) == 8
        assert mon.state is MonitorState.LIVE and mon.detail.startswith("engine agent unavailable")
        assert s.gpus[0].name == "NVIDIA H200" and s.gpus[0].procs[0].cmd == "VLLM::Worker_TP0"
        assert s.host is not None and s.host.mem_total
    finally:
        await hub.close()


@pytest.mark.sshd
async def test_agent_over_ssh_survives_a_dropped_connection(sshd: SSHD, tmp_path: Path) -> None:
    host = HostConfig(name="gpu1", ssh=sshd.target, known_hosts=str(sshd.known_hosts),
                      identity=str(sshd.user_key), python=sys.executable,
                      root=str(tmp_path / "root"))
    hub = _hub(host, interval=0.25)
    mon = hub["gpu1"]
    try:
        hub.watch("gpu1")
        await _until(lambda: mon.version >= 2, 40)
        last = mon.sample
        assert last is not None and last.source == "engine"
        sshd.drop_connections()
        await _until(lambda: mon.state is MonitorState.RECONNECTING, 10)
        assert mon.sample is last
        await _until(lambda: mon.state is MonitorState.LIVE and mon.sample is not last, 40)
    finally:
        await hub.close()
        await hub.pool.close()


# -- the rules, on samples built in the test ---------------------------------------------------

def _sample(t: float, gpus: list[GpuStat], interval: float = 1.0) -> Sample:
    return Sample(t=t, interval=interval, source="engine", gpus=tuple(gpus),
                  host=HostStat(cpu=(10.0, 30.0), mem_used=1, mem_total=4))


def test_staleness_per_host_and_per_gpu() -> None:
    mon = HostMonitor("h", 1.0, history_s=600)
    ok = [GpuStat(index=i, util=50.0, mem_used=1, mem_total=2) for i in range(2)]
    for t in range(10):
        lost = GpuStat(index=1, error="GPU is lost") if t >= 5 else ok[1]
        mon.ingest(_sample(float(t), [ok[0], lost]), now=float(t))
    assert not mon.stale(9.0) and mon.stale(12.5)          # three intervals
    assert not mon.gpu_stale(0, 9.0)
    assert mon.gpu_stale(1, 9.0) and mon.gpu_error[1] == "GPU is lost"
    assert mon.gpus[1].util == 50.0                         # its last good data is kept
    assert mon.gpu_list()[1].index == 1 and len(mon.history[1]) == 5
    assert mon.host_history[-1].cpu == 20.0 and mon.host_history[-1].mem == 0.25


def test_history_is_bounded_and_covers_five_minutes() -> None:
    mon = HostMonitor("h", 1.0, history_s=300)
    for t in range(2000):
        mon.ingest(_sample(float(t), [GpuStat(index=0, util=float(t % 100))]), now=float(t))
    hist = mon.history[0]
    assert len(hist) <= 303 and hist[-1].t - hist[0].t >= 300
    assert len(mon.host_history) <= 303


def test_gpu_gone_for_the_whole_window_is_forgotten() -> None:
    mon = HostMonitor("h", 1.0, history_s=30)
    mon.ingest(_sample(0.0, [GpuStat(index=0), GpuStat(index=1)]), now=0.0)
    for t in range(1, 40):
        mon.ingest(_sample(float(t), [GpuStat(index=0)]), now=float(t))
    assert list(mon.gpus) == [0] and 1 not in mon.history
