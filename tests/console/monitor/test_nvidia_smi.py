"""The nvidia-smi fallback: the CSV mapping on recorded nvidia-smi output, and the real fallback
script run through the local transport (with nvidia-smi absent, and with an `nvidia-smi` on PATH
that prints the recorded output)."""

from __future__ import annotations

import getpass
import os
import stat
from pathlib import Path

import pytest

from console.monitor.nvidia_smi import (
    MIB,
    NvidiaSmiSampler,
    parse_apps,
    parse_gpus,
    parse_ps,
    with_processes,
)
from console.monitor.proc_stats import parse_cpu, parse_df, parse_meminfo, parse_net
from console.transport.local import LocalTransport
from tests.paths import FIXTURES

FIX = FIXTURES / "nvidia_smi"


def _read(name: str) -> str:
    return (FIX / name).read_text()


def test_h100_training_rows_map_to_the_agent_record() -> None:
    gpus, other = parse_gpus(_read("h100x8_training.gpu.csv"))
    assert other == [] and [g.index for g in gpus] == list(range(8))
    g = gpus[0]
    assert g.name == "NVIDIA H100 80GB HBM3"
    assert g.uuid == "GPU-5c8a31f2-7b0e-9d1a-44e2-1f0b9c3d7a61"
    assert (g.util, g.mem_util, g.temp, g.power, g.power_limit) == (100, 62, 61, 618.42, 700.0)
    assert g.mem_used == 76883 * MIB and g.mem_total == 81559 * MIB
    assert (g.sm_clock, g.mem_clock, g.pstate, g.ecc_uncorrected) == (1980, 2619, 0, 0)
    assert g.fan is None                       # [N/A]: SXM boards have no fan of their own
    assert g.pcie_rx is None and g.pcie_tx is None  # nvidia-smi --query-gpu has no PCIe rates
    assert gpus[5].ecc_uncorrected == 2
    apps = parse_apps(_read("h100x8_training.apps.csv"))
    attached = with_processes(gpus, apps, {})
    assert [len(x.procs) for x in attached] == [1] * 8
    p = attached[7].procs[0]
    assert (p.gpu, p.pid, p.cmd, p.gpu_mem, p.user) == (7, 184218, "/usr/bin/python3",
                                                        76870 * MIB, None)


def test_h200_vllm_na_process_memory_and_idle_gpu() -> None:
    gpus, _ = parse_gpus(_read("h200x8_vllm.gpu.csv"))
    assert gpus[0].mem_total == 143771 * MIB and gpus[0].mem_clock == 3201
    assert gpus[7].util == 0 and gpus[7].mem_used == 0 and gpus[7].sm_clock == 345
    attached = with_processes(gpus, parse_apps(_read("h200x8_vllm.apps.csv")), {})
    assert attached[6].procs[0].gpu_mem is None and attached[6].procs[0].cmd == "VLLM::Worker_TP6"
    assert attached[7].procs == ()


def test_not_supported_values_are_none() -> None:
    gpus, other = parse_gpus(_read("workstation_mixed.gpu.csv"))
    assert other == []
    rtx, gtx = gpus
    assert rtx.fan == 30 and rtx.ecc_uncorrected is None and rtx.pstate == 2
    assert gtx.power is None and gtx.power_limit is None and gtx.ecc_uncorrected is None
    assert gtx.pstate == 8 and gtx.mem_used == 2 * MIB


def test_lost_gpu_line_is_kept_and_its_row_is_missing() -> None:
    gpus, other = parse_gpus(_read("h100x8_gpu_lost.gpu.csv"))
    assert [g.index for g in gpus] == [0, 1, 2, 4, 5, 6, 7]
    assert other == ["Unable to determine the device handle for GPU0000:9A:00.0: Unknown Error"]
    assert gpus[4].ecc_uncorrected is None    # [GPU requires reset]
    sampler = NvidiaSmiSampler(1.0, "/data")
    out = ("@@gpu 15\n" + _read("h100x8_gpu_lost.gpu.csv") + "@@apps\n\n@@ps\n")
    s = sampler.parse(out, t=10.0)
    assert len(s.gpus) == 7 and "GPU0000:9A:00.0" in (s.reason or "")
    assert s.host is None and s.source == "nvidia-smi"


def test_no_driver_reason() -> None:
    s = NvidiaSmiSampler(1.0, "/").parse("@@gpu 9\n" + _read("no_driver.txt") + "@@apps\n", 1.0)
    assert s.gpus == () and s.reason is not None
    assert s.reason.startswith("nvidia-smi failed (exit 9): NVIDIA-SMI has failed because")


def test_ps_owners() -> None:
    owners = parse_ps("  3170 vllm     python3 -m vllm.entrypoints.openai.api_server --tp 8\n"
                      "184211 alice    /usr/bin/python3 -m engine train\n")
    assert owners[3170] == ("vllm", "python3 -m vllm.entrypoints.openai.api_server --tp 8")
    assert owners[184211][0] == "alice"


def test_proc_parsers() -> None:
    cpu = parse_cpu("cpu  10 0 5 80 5 0 0 0 0 0\ncpu0 6 0 2 40 2 0 0 0 0 0\ncpu1 4 0 3 40 3 0 0 0")
    assert cpu == {"cpu0": (8, 50), "cpu1": (7, 50)}
    mem = parse_meminfo("MemTotal:       16384 kB\nMemAvailable:    4096 kB\nHugePages_Total: 0\n")
    assert mem == {"MemTotal": 16384 * 1024, "MemAvailable": 4096 * 1024, "HugePages_Total": 0}
    net = ("Inter-|   Receive |  Transmit\n face |bytes packets|bytes\n"
           "    lo: 500 5 0 0 0 0 0 0 500 5 0 0 0 0 0 0\n"
           "  eth0: 1000 10 0 0 0 0 0 0 2000 20 0 0 0 0 0 0\n")
    assert parse_net(net) == (1000, 2000)
    assert parse_df("Filesystem 1024-blocks Used Available Capacity Mounted on\n"
                    "/dev/vda 1000 250 750 25% /\n") == (250 * 1024, 1000 * 1024)


async def test_fallback_script_on_this_host_without_nvidia_smi(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # whatever the dev box has, no nvidia-smi here
    if any(os.access(os.path.join(d, "nvidia-smi"), os.X_OK) for d in ("/usr/bin", "/bin")):
        pytest.skip("this machine has nvidia-smi")
    t = LocalTransport()
    sampler = NvidiaSmiSampler(0.5, str(tmp_path))
    first = sampler.parse((await t.run_script(sampler.script(), check=True)).stdout, 100.0)
    second = sampler.parse((await t.run_script(sampler.script(), check=True)).stdout, 100.5)
    assert first.gpus == () and first.reason == "nvidia-smi not found on this host"
    h = second.host
    assert h is not None and len(h.cpu) == os.cpu_count()
    assert h.load is not None and len(h.load) == 3
    assert h.mem_total and 0 < (h.mem_used or 0) < h.mem_total
    assert h.disk_total and h.disk_used and h.disk_path == str(tmp_path)
    assert h.net_rx is not None and h.net_rx >= 0 and first.host and first.host.net_rx is None


async def test_fallback_script_with_recorded_nvidia_smi(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # an `nvidia-smi` executable that prints the recorded output; one app is this test process,
    # so `ps` resolves its owner and command line
    apps = _read("h100x8_training.apps.csv").replace("184213", str(os.getpid()))
    (tmp_path / "apps.csv").write_text(apps)
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\ncase \"$1\" in\n"
                    f"  --query-gpu=*) cat {FIX / 'h100x8_training.gpu.csv'} ;;\n"
                    f"  --query-compute-apps=*) cat {tmp_path / 'apps.csv'} ;;\n"
                    "  *) exit 2 ;;\nesac\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    sampler = NvidiaSmiSampler(1.0, str(tmp_path))
    out = await LocalTransport().run_script(sampler.script(), check=True)
    s = sampler.parse(out.stdout, 5.0)
    assert s.reason is None and len(s.gpus) == 8
    mine = s.gpus[2].procs[0]
    assert mine.pid == os.getpid() and mine.user == getpass.getuser()
    own = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    assert mine.cmd and len(mine.cmd) >= 20 and own.startswith(mine.cmd)  # maybe cut short
    assert s.gpus[3].procs[0].user is None  # pid 184214 is not running here
