"""The monitor agent's sampler: every GPU through NVML and the host through psutil, as plain data.

`python -m engine monitor --events` (engine/commands/monitor.py) writes one `sample` event per
interval whose payload is `Monitor.sample()`:

    interval  float         seconds between samples
    hostname  str
    driver    str | None    NVML's driver version
    reason    str | None    why `gpus` is empty (no nvidia-ml-py, no driver, ...); else None
    gpus      [gpu, ...]
    host      {...} | None  None (with host_reason) when psutil is missing

gpu (a field the GPU does not support is null, never an error):
    index, name, uuid
    util, mem_util          %, GPU busy and memory-controller busy over NVML's last period
    mem_used, mem_total     bytes
    temp                    degrees C
    power, power_limit      W (draw, enforced limit)
    sm_clock, mem_clock     MHz
    pcie_rx, pcie_tx        bytes/s
    fan                     % of maximum speed
    ecc_uncorrected         uncorrected (double-bit) ECC errors since the driver loaded
    pstate                  int, 0 = P0 (fastest)
    error                   str | None: set when the whole GPU failed (e.g. "GPU is lost")
    procs                   [{pid, user, cmd, gpu_mem (bytes | null), type "C" | "G" | "C+G"}]

host:
    cpu      [% per core]          load  [1, 5, 15 min]
    mem_used, mem_total, swap_used, swap_total   bytes
    disk     {path, used, total} or {path, error}
    net_rx, net_tx                bytes/s over every interface but loopback

Cost: NVML is initialised once and handles are kept; counters that NVML can read in one call
(ECC, PCIe byte counters) are read together with nvmlDeviceGetFieldValues; a query a GPU answers
"not supported" is never asked again; process owners and command lines are cached per pid.
Imports no torch.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

# NVML return codes we treat specially (values from nvml.h; stable across versions)
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_SKIP_FOREVER = (_NOT_SUPPORTED, _NO_PERMISSION, _FUNCTION_NOT_FOUND)

# nvmlDeviceGetFieldValues ids (nvml.h): read in one call per GPU
_FI_ECC_DBE_VOL_TOTAL = 4
_FI_PCIE_TX_BYTES = 197
_FI_PCIE_RX_BYTES = 198
_FIELDS = (_FI_ECC_DBE_VOL_TOTAL, _FI_PCIE_TX_BYTES, _FI_PCIE_RX_BYTES)

GPU_FIELDS = ("util", "mem_util", "mem_used", "mem_total", "temp", "power", "power_limit",
              "sm_clock", "mem_clock", "pcie_rx", "pcie_tx", "fan", "ecc_uncorrected", "pstate")


class _GpuLost(Exception):
    """The GPU stopped answering (fell off the bus, Xid 79): report it, keep the others."""


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _field_value(fv: Any) -> float | int | None:
    """The number in an nvmlFieldValue_t, by its valueType; None when NVML had no value."""
    if getattr(fv, "nvmlReturn", 0) != 0:
        return None
    kind = fv.valueType
    val = fv.value
    return {0: lambda: val.dVal, 1: lambda: val.uiVal, 2: lambda: val.ulVal,
            3: lambda: val.ullVal, 4: lambda: val.sllVal, 5: lambda: val.siVal,
            6: lambda: val.usVal}.get(kind, lambda: None)()


class ProcessInfo:
    """pid -> (user, command line), cached for the process's lifetime (pids are reused, so the
    cache key includes the start time)."""

    def __init__(self, psutil: ModuleType | None) -> None:
        self.psutil = psutil
        self._cache: dict[int, tuple[float, str | None, str | None]] = {}

    def lookup(self, pid: int) -> tuple[str | None, str | None]:
        if self.psutil is None:
            return None, None
        try:
            p = self.psutil.Process(pid)
            started = p.create_time()
            hit = self._cache.get(pid)
            if hit is not None and hit[0] == started:
                return hit[1], hit[2]
            with p.oneshot():
                user = p.username()
                cmd = " ".join(p.cmdline()) or p.name()
        except Exception:  # gone, or in another PID namespace (containers): unknown, not fatal
            return None, None
        self._cache[pid] = (started, user, cmd[:500])
        return user, cmd[:500]

    def forget_except(self, live: set[int]) -> None:
        for pid in [p for p in self._cache if p not in live]:
            del self._cache[pid]


class GpuSampler:
    """Every GPU NVML sees. open() never raises: without NVML, `reason` says why."""

    def __init__(self, nvml: ModuleType | None = None, procs: ProcessInfo | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.nvml = nvml
        self.procs = procs or ProcessInfo(None)
        self.clock = clock
        self.reason: str | None = None
        self.driver: str | None = None
        self.handles: list[Any] = []
        self._static: list[dict[str, Any]] = []
        self._skip: list[set[str]] = []          # per GPU: queries it does not support
        self._pcie_prev: list[tuple[float, int, int] | None] = []

    def open(self) -> None:
        if self.nvml is None:
            try:
                import pynvml
            except ImportError:
                self.reason = "nvidia-ml-py is not installed on this host"
                return
            self.nvml = pynvml
        nv = self.nvml
        try:
            nv.nvmlInit()
        except Exception as e:  # NVMLError: no library, no driver, driver/library mismatch
            self.reason = f"NVML unavailable: {e}"
            self.nvml = None
            return
        try:
            self.driver = _text(nv.nvmlSystemGetDriverVersion())
        except Exception:
            self.driver = None
        try:
            count = nv.nvmlDeviceGetCount()
        except Exception as e:
            self.reason = f"NVML could not count GPUs: {e}"
            return
        for i in range(count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
            except Exception as e:  # a lost GPU still gets a row, with the error
                self.handles.append(None)
                self._static.append({"index": i, "name": None, "uuid": None, "error": str(e)})
            else:
                self.handles.append(h)
                self._static.append({"index": i, "name": self._once(h, "nvmlDeviceGetName"),
                                     "uuid": self._once(h, "nvmlDeviceGetUUID"), "error": None})
            self._skip.append(set())
            self._pcie_prev.append(None)
        if count == 0:
            self.reason = "NVML found no GPUs"
        self._read_pcie_counters_all()  # prime the byte counters: the first sample has rates

    def _once(self, h: Any, fn: str) -> str | None:
        try:
            return _text(getattr(self.nvml, fn)(h))
        except Exception:
            return None

    def close(self) -> None:
        if self.nvml is not None and self.handles is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass

    # -- one query, with "not supported" remembered -------------------------------------------
    def _q(self, i: int, key: str, call: Callable[[], Any]) -> Any:
        if key in self._skip[i]:
            return None
        try:
            return call()
        except Exception as e:
            code = getattr(e, "value", None)
            if code == _GPU_IS_LOST:
                raise _GpuLost(str(e)) from e
            if code in _SKIP_FOREVER or isinstance(e, (AttributeError, NotImplementedError)):
                self._skip[i].add(key)
            return None  # transient (e.g. "Unknown Error"): null this time, ask again next time

    def _read_pcie_counters_all(self) -> None:
        for i, h in enumerate(self.handles):
            if h is not None:
                try:
                    self._fields(i, h)
                except _GpuLost:
                    pass

    def _fields(self, i: int, h: Any) -> dict[str, Any]:
        """ECC and PCIe counters in one nvmlDeviceGetFieldValues call; PCIe as rates."""
        out: dict[str, Any] = {"ecc_uncorrected": None, "pcie_rx": None, "pcie_tx": None}
        nv = self.nvml
        assert nv is not None
        values = self._q(i, "fields", lambda: nv.nvmlDeviceGetFieldValues(h, list(_FIELDS)))
        if values is None:
            return out
        got = {int(fv.fieldId): _field_value(fv) for fv in values}
        ecc = got.get(_FI_ECC_DBE_VOL_TOTAL)
        out["ecc_uncorrected"] = None if ecc is None else int(ecc)
        tx, rx = got.get(_FI_PCIE_TX_BYTES), got.get(_FI_PCIE_RX_BYTES)
        if tx is not None and rx is not None:
            now = self.clock()
            prev = self._pcie_prev[i]
            self._pcie_prev[i] = (now, int(tx), int(rx))
            if prev is not None and now > prev[0] and tx >= prev[1] and rx >= prev[2]:
                dt = now - prev[0]
                out["pcie_tx"] = round((tx - prev[1]) / dt)
                out["pcie_rx"] = round((rx - prev[2]) / dt)
        return out

    def _pcie_fallback(self, i: int, h: Any, out: dict[str, Any]) -> None:
        """Older drivers without the byte counters: NVML's own 20 ms throughput sample (KB/s)."""
        nv = self.nvml
        assert nv is not None
        rx = self._q(i, "pcie_rx", lambda: nv.nvmlDeviceGetPcieThroughput(h, 1))  # RX_BYTES = 1
        tx = self._q(i, "pcie_tx", lambda: nv.nvmlDeviceGetPcieThroughput(h, 0))  # TX_BYTES = 0
        out["pcie_rx"] = None if rx is None else int(rx) * 1024
        out["pcie_tx"] = None if tx is None else int(tx) * 1024

    # -- the sample -----------------------------------------------------------------------------
    def sample(self) -> list[dict[str, Any]]:
        gpus = []
        for i, h in enumerate(self.handles):
            rec: dict[str, Any] = {**self._static[i], **dict.fromkeys(GPU_FIELDS), "procs": []}
            if h is not None:
                try:
                    self._sample_gpu(i, h, rec)
                except _GpuLost as e:
                    rec.update(dict.fromkeys(GPU_FIELDS))
                    rec["error"], rec["procs"] = str(e) or "GPU is lost", []
            gpus.append(rec)
        self.procs.forget_except({p["pid"] for g in gpus for p in g["procs"]})
        return gpus

    def _sample_gpu(self, i: int, h: Any, rec: dict[str, Any]) -> None:
        nv = self.nvml
        assert nv is not None
        util = self._q(i, "util", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            rec["util"], rec["mem_util"] = int(util.gpu), int(util.memory)
        mem = self._q(i, "mem", lambda: nv.nvmlDeviceGetMemoryInfo(h))
        if mem is not None:
            rec["mem_used"], rec["mem_total"] = int(mem.used), int(mem.total)
        rec["temp"] = self._q(i, "temp", lambda: nv.nvmlDeviceGetTemperature(h, 0))  # GPU sensor
        power = self._q(i, "power", lambda: nv.nvmlDeviceGetPowerUsage(h))
        rec["power"] = None if power is None else round(power / 1000, 1)    # mW -> W
        limit = self._q(i, "power_limit", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h))
        rec["power_limit"] = None if limit is None else round(limit / 1000, 1)
        rec["sm_clock"] = self._q(i, "sm_clock", lambda: nv.nvmlDeviceGetClockInfo(h, 1))
        rec["mem_clock"] = self._q(i, "mem_clock", lambda: nv.nvmlDeviceGetClockInfo(h, 2))
        rec["fan"] = self._q(i, "fan", lambda: nv.nvmlDeviceGetFanSpeed(h))
        rec["pstate"] = self._q(i, "pstate", lambda: nv.nvmlDeviceGetPerformanceState(h))
        fields = self._fields(i, h)
        rec["ecc_uncorrected"] = fields["ecc_uncorrected"]
        if "fields" in self._skip[i] or fields["pcie_rx"] is None and self._pcie_prev[i] is None:
            if fields["ecc_uncorrected"] is None:
                rec["ecc_uncorrected"] = self._q(i, "ecc", lambda: nv.nvmlDeviceGetTotalEccErrors(
                    h, 1, 0))  # MEMORY_ERROR_TYPE_UNCORRECTED, VOLATILE_ECC
            self._pcie_fallback(i, h, rec)
        else:
            rec["pcie_rx"], rec["pcie_tx"] = fields["pcie_rx"], fields["pcie_tx"]
        rec["procs"] = self._processes(i, h)

    def _processes(self, i: int, h: Any) -> list[dict[str, Any]]:
        nv = self.nvml
        assert nv is not None
        by_pid: dict[int, dict[str, Any]] = {}
        for kind, fn in (("C", "nvmlDeviceGetComputeRunningProcesses"),
                         ("G", "nvmlDeviceGetGraphicsRunningProcesses")):
            def query(name: str = fn) -> Any:   # looked up inside _q: old NVML may lack it
                return getattr(nv, name)(h)
            found = self._q(i, fn, query) or []
            for p in found:
                pid = int(p.pid)
                used = getattr(p, "usedGpuMemory", None)
                if pid in by_pid:
                    by_pid[pid]["type"] = "C+G"
                    continue
                user, cmd = self.procs.lookup(pid)
                by_pid[pid] = {"pid": pid, "user": user, "cmd": cmd,
                               "gpu_mem": int(used) if isinstance(used, int) else None,
                               "type": kind}
        return sorted(by_pid.values(), key=lambda p: p["pid"])


class HostSampler:
    """CPU, load, memory, swap, disk use of one path and network rates, through psutil."""

    def __init__(self, psutil: ModuleType, path: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ps = psutil
        self.path = os.path.abspath(os.path.expanduser(path))
        self.clock = clock
        self.ps.cpu_percent(percpu=True)  # prime: psutil measures CPU since the previous call
        self._net_prev = (self.clock(), *self._net_bytes())

    def _net_bytes(self) -> tuple[int, int]:
        rx = tx = 0
        try:
            counters = self.ps.net_io_counters(pernic=True)
        except Exception:
            return 0, 0
        for nic, c in counters.items():
            if nic != "lo":
                rx, tx = rx + c.bytes_recv, tx + c.bytes_sent
        return rx, tx

    def sample(self) -> dict[str, Any]:
        vm = self.ps.virtual_memory()
        sw = self.ps.swap_memory()
        now, (rx, tx) = self.clock(), self._net_bytes()
        t0, rx0, tx0 = self._net_prev
        self._net_prev = (now, rx, tx)
        dt = now - t0
        try:
            du = shutil.disk_usage(self.path)
            disk: dict[str, Any] = {"path": self.path, "used": du.used, "total": du.total}
        except OSError as e:
            disk = {"path": self.path, "error": e.strerror or str(e)}
        try:
            load = [round(x, 2) for x in os.getloadavg()]
        except OSError:
            load = None
        return {
            "cpu": [round(x, 1) for x in self.ps.cpu_percent(percpu=True)],
            "load": load,
            "mem_used": int(vm.total - vm.available), "mem_total": int(vm.total),
            "swap_used": int(sw.used), "swap_total": int(sw.total),
            "disk": disk,
            # counters can go backwards when an interface disappears: report 0, not negative
            "net_rx": round(max(0, rx - rx0) / dt) if dt > 0 else None,
            "net_tx": round(max(0, tx - tx0) / dt) if dt > 0 else None,
        }


class Monitor:
    """GPUs and host together; `sample()` is one event's payload."""

    def __init__(self, path: str = ".", interval: float = 1.0, nvml: ModuleType | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        try:
            import psutil
        except ImportError:
            psutil = None
        self.host = HostSampler(psutil, path, clock) if psutil is not None else None
        self.gpus = GpuSampler(nvml, ProcessInfo(psutil), clock)
        self.gpus.open()
        self.hostname = socket.gethostname()

    def sample(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "interval": self.interval, "hostname": self.hostname, "driver": self.gpus.driver,
            "reason": self.gpus.reason, "gpus": self.gpus.sample(),
            "host": self.host.sample() if self.host is not None else None,
        }
        if self.host is None:
            data["host_reason"] = "psutil is not installed on this host"
        return data

    def close(self) -> None:
        self.gpus.close()
