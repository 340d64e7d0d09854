"""The monitor agent: the real `python -m engine monitor` on this GPU-less machine (the no-NVML
path), and the GPU sampler's null/skip/lost handling against an NVML stand-in built from
nvidia-ml-py's own structures and error classes (the library, not our code, is replaced)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import psutil
import pynvml

from engine import events
from engine.monitor import GPU_FIELDS, GpuSampler, ProcessInfo
from tests.paths import REPO as _REPO

REPO = str(_REPO)


def _engine(*args: str, **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "engine", *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_agent_streams_samples_without_nvml(tmp_path: Any) -> None:
    proc = _engine("monitor", "--events", "--interval", "0.2", "--path", str(tmp_path))
    got: list[events.Event] = []
    arrived: list[float] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # each event must be flushed as it is taken
            ev = events.parse(line)
            assert ev is not None, f"not an event: {line!r}"
            got.append(ev)
            arrived.append(time.monotonic())
            if len(got) == 4:
                break
    finally:
        proc.kill()
        proc.wait()
    assert [e.kind for e in got] == ["sample"] * 4
    gaps = [b.t - a.t for a, b in zip(got, got[1:], strict=False)]
    assert all(0.1 < g < 0.6 for g in gaps), gaps
    last = got[-1]
    assert isinstance(last, events.Sample)
    s = last.data
    assert s["gpus"] == [] and s["driver"] is None
    assert "NVML" in s["reason"] or "nvidia-ml-py" in s["reason"]
    assert s["interval"] == 0.2
    h = s["host"]
    assert len(h["cpu"]) == psutil.cpu_count() and all(0 <= c <= 100 for c in h["cpu"])
    assert len(h["load"]) == 3
    assert 0 < h["mem_used"] < h["mem_total"] and h["swap_total"] >= h["swap_used"] >= 0
    assert h["disk"]["path"] == str(tmp_path) and 0 < h["disk"]["used"] < h["disk"]["total"]
    assert h["net_rx"] >= 0 and h["net_tx"] >= 0


def test_agent_imports_no_torch() -> None:
    code = ("import sys; from engine.cli import main; rc = main(['monitor', '--count', '1', "
            "'--interval', '0.1', '--events']); "
            "assert 'torch' not in sys.modules and 'textual' not in sys.modules; sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert events.parse(out.stdout.splitlines()[0]).kind == "sample"  # type: ignore[union-attr]


def test_agent_human_output_and_bad_interval() -> None:
    out = subprocess.run([sys.executable, "-m", "engine", "monitor", "--count", "1",
                          "--interval", "0.1"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("gpus: none (")
    assert "host: cpu" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "engine", "monitor", "--interval", "0"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "error: --interval must be more than 0.05 s, got 0.0"]


# -- the GPU sampler against an NVML stand-in ---------------------------------------------------

def _fv(field: int, value: int | None) -> pynvml.c_nvmlFieldValue_t:
    fv = pynvml.c_nvmlFieldValue_t()
    fv.fieldId = field
    if value is None:
        fv.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
    else:
        fv.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        fv.value.ullVal = value
    return fv


class FakeNvml:
    """What pynvml exposes, for two GPUs: GPU 1 lacks fan and power (like an SXM part behind a
    BMC), `lost` makes GPU 0 fall off the bus. Counts every call."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.lost = False
        self.pcie = [[1000, 5000], [0, 0]]  # per GPU: tx, rx byte counters
        self.procs = {0: [SimpleNamespace(pid=os.getpid(), usedGpuMemory=3 * 2**30),
                          SimpleNamespace(pid=2**22 + 7, usedGpuMemory=None)], 1: []}

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)

    def _c(self, name: str, h: int) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.lost and h == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str: return "550.54.15"
    def nvmlDeviceGetCount(self) -> int: return 2
    def nvmlDeviceGetHandleByIndex(self, i: int) -> int: return i
    def nvmlDeviceGetName(self, h: int) -> str: return "NVIDIA H200"
    def nvmlDeviceGetUUID(self, h: int) -> bytes: return f"GPU-{h:08d}".encode()

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        self._c("util", h)
        return pynvml.c_nvmlUtilization_t(gpu=87, memory=41)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        self._c("mem", h)
        return SimpleNamespace(used=80 * 2**30, total=141 * 2**30, free=61 * 2**30)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        self._c("temp", h)
        return 64

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        self._c("power", h)
        if h == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 612_345

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        self._c("power_limit", h)
        return 700_000

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        self._c("clock", h)
        return 1980 if kind == 1 else 2619

    def nvmlDeviceGetFanSpeed(self, h: int) -> int:
        self._c("fan", h)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # SXM boards: no fan

    def nvmlDeviceGetPerformanceState(self, h: int) -> int:
        self._c("pstate", h)
        return 0

    def nvmlDeviceGetFieldValues(self, h: int, ids: list[int]) -> Any:
        self._c("fields", h)
        tx, rx = self.pcie[h]
        vals = {4: 0 if h == 0 else None, 197: tx, 198: rx}
        return [_fv(i, vals[i]) for i in ids]

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        self._c("procs", h)
        return self.procs[h]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> list[Any]:
        self._c("gprocs", h)
        return []


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_gpu_sampler_nulls_unsupported_and_skips_them_later() -> None:
    nv, clock = FakeNvml(), Clock()
    s = GpuSampler(nv, ProcessInfo(psutil), clock)  # type: ignore[arg-type]
    s.open()
    assert s.reason is None and s.driver == "550.54.15"
    clock.t += 2.0
    nv.pcie[0] = [1000 + 2_000_000, 5000 + 8_000_000]
    g0, g1 = s.sample()
    assert set(GPU_FIELDS) <= set(g0) and set(GPU_FIELDS) <= set(g1)
    assert g0["uuid"] == "GPU-00000000" and g0["name"] == "NVIDIA H200"
    assert (g0["util"], g0["mem_util"], g0["temp"], g0["power"], g0["power_limit"]) == (
        87, 41, 64, 612.3, 700.0)
    assert g0["mem_used"] == 80 * 2**30 and g0["mem_total"] == 141 * 2**30
    assert (g0["sm_clock"], g0["mem_clock"], g0["pstate"]) == (1980, 2619, 0)
    assert g0["pcie_tx"] == 1_000_000 and g0["pcie_rx"] == 4_000_000   # counters -> bytes/s
    assert g0["ecc_uncorrected"] == 0 and g1["ecc_uncorrected"] is None
    assert g0["fan"] is None and g1["fan"] is None and g1["power"] is None
    mine, gone = g0["procs"]
    assert mine["pid"] == os.getpid() and mine["gpu_mem"] == 3 * 2**30 and mine["type"] == "C"
    assert mine["user"] == psutil.Process().username()
    assert mine["cmd"] == " ".join(psutil.Process().cmdline())
    assert gone["user"] is None and gone["cmd"] is None and gone["gpu_mem"] is None
    json.dumps([g0, g1])  # the record is plain JSON
    fan_calls, power_calls = nv.calls["fan"], nv.calls["power"]
    s.sample()
    assert nv.calls["fan"] == fan_calls            # unsupported: never asked again
    assert nv.calls["power"] == power_calls + 1    # GPU 0 supports it, GPU 1 is skipped
    assert nv.calls["fields"] == 2 * 3             # one batched counter read per GPU per sample


def test_gpu_sampler_reports_a_lost_gpu_and_keeps_the_others() -> None:
    nv = FakeNvml()
    s = GpuSampler(nv, ProcessInfo(psutil), Clock())  # type: ignore[arg-type]
    s.open()
    nv.lost = True
    g0, g1 = s.sample()
    assert g0["error"] == "GPU is lost" and g0["util"] is None and g0["procs"] == []
    assert g1["error"] is None and g1["util"] == 87
    nv.lost = False
    assert s.sample()[0]["util"] == 87  # a transient loss is not remembered as unsupported


def test_gpu_sampler_without_nvml_library() -> None:
    class NoLib:
        def nvmlInit(self) -> None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    s = GpuSampler(NoLib())  # type: ignore[arg-type]
    s.open()
    assert s.sample() == [] and s.reason == "NVML unavailable: NVML Shared Library Not Found"
    s.close()


def test_agent_reports_an_unreadable_disk_path_in_the_record(tmp_path: Any) -> None:
    out = subprocess.run([sys.executable, "-m", "engine", "monitor", "--events", "--count", "1",
                          "--interval", "0.1", "--path", str(tmp_path / "nope")], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    disk = json.loads(out.stdout)["host"]["disk"]
    assert disk == {"path": str(tmp_path / "nope"), "error": "No such file or directory"}
