"""One monitor sample as typed records: what the agent's `sample` event and the nvidia-smi
fallback both become. The agent's record is documented in engine/monitor.py; this side is
tolerant (a missing or wrongly typed field is None) because hosts run other engine versions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU."""

    gpu: int                    # GPU index
    pid: int
    user: str | None
    cmd: str | None
    gpu_mem: int | None         # bytes
    type: str = "C"             # C compute, G graphics, C+G


@dataclass(frozen=True)
class GpuStat:
    """One GPU in one sample; None means the GPU (or the source) does not report it."""

    index: int
    name: str | None = None
    uuid: str | None = None
    util: float | None = None            # %
    mem_util: float | None = None        # %
    mem_used: int | None = None          # bytes
    mem_total: int | None = None         # bytes
    temp: float | None = None            # C
    power: float | None = None           # W
    power_limit: float | None = None     # W
    sm_clock: int | None = None          # MHz
    mem_clock: int | None = None         # MHz
    pcie_rx: float | None = None         # bytes/s
    pcie_tx: float | None = None         # bytes/s
    fan: float | None = None             # %
    ecc_uncorrected: int | None = None
    pstate: int | None = None            # 0 = P0
    error: str | None = None             # the whole GPU failed ("GPU is lost")
    procs: tuple[GpuProcess, ...] = ()

    @property
    def mem_frac(self) -> float | None:
        if self.mem_used is None or not self.mem_total:
            return None
        return self.mem_used / self.mem_total


@dataclass(frozen=True)
class HostStat:
    """The host's CPU, memory, disk and network in one sample."""

    cpu: tuple[float, ...] = ()          # % per core
    load: tuple[float, ...] | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    swap_used: int | None = None
    swap_total: int | None = None
    disk_path: str | None = None
    disk_used: int | None = None
    disk_total: int | None = None
    disk_error: str | None = None
    net_rx: float | None = None          # bytes/s
    net_tx: float | None = None          # bytes/s

    @property
    def cpu_avg(self) -> float | None:
        return sum(self.cpu) / len(self.cpu) if self.cpu else None


@dataclass(frozen=True)
class Sample:
    """Everything one sample says about a host."""

    t: float                             # the source's clock (unix seconds)
    interval: float
    source: str                          # "engine" or "nvidia-smi"
    hostname: str | None = None
    driver: str | None = None
    reason: str | None = None            # why there are no GPUs
    gpus: tuple[GpuStat, ...] = ()
    host: HostStat | None = None
    host_reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


_GPU_NUM = ("util", "mem_util", "temp", "power", "power_limit", "pcie_rx", "pcie_tx", "fan")
_GPU_INT = ("mem_used", "mem_total", "sm_clock", "mem_clock", "ecc_uncorrected", "pstate")


def gpu_from_dict(d: dict[str, Any]) -> GpuStat | None:
    index = _int(d.get("index"))
    if index is None:
        return None
    procs = []
    for p in d.get("procs") or []:
        if isinstance(p, dict) and _int(p.get("pid")) is not None:
            procs.append(GpuProcess(gpu=index, pid=int(p["pid"]), user=_str(p.get("user")),
                                    cmd=_str(p.get("cmd")), gpu_mem=_int(p.get("gpu_mem")),
                                    type=_str(p.get("type")) or "C"))
    return GpuStat(index=index, name=_str(d.get("name")), uuid=_str(d.get("uuid")),
                   error=_str(d.get("error")), procs=tuple(procs),
                   **{k: _num(d.get(k)) for k in _GPU_NUM},  # type: ignore[arg-type]
                   **{k: _int(d.get(k)) for k in _GPU_INT})


def host_from_dict(d: dict[str, Any]) -> HostStat:
    disk = d["disk"] if isinstance(d.get("disk"), dict) else {}
    load = d.get("load")
    return HostStat(
        cpu=tuple(x for x in (_num(c) for c in d.get("cpu") or []) if x is not None),
        load=tuple(float(x) for x in load) if isinstance(load, list) and all(
            _num(x) is not None for x in load) else None,
        mem_used=_int(d.get("mem_used")), mem_total=_int(d.get("mem_total")),
        swap_used=_int(d.get("swap_used")), swap_total=_int(d.get("swap_total")),
        disk_path=_str(disk.get("path")), disk_used=_int(disk.get("used")),
        disk_total=_int(disk.get("total")), disk_error=_str(disk.get("error")),
        net_rx=_num(d.get("net_rx")), net_tx=_num(d.get("net_tx")))


def sample_from_event(data: dict[str, Any], t: float, source: str = "engine") -> Sample:
    """The Sample a `sample` event's payload describes (never raises on odd fields)."""
    gpus = [g for g in (gpu_from_dict(x) for x in data.get("gpus") or [] if isinstance(x, dict))
            if g is not None]
    host = data.get("host")
    return Sample(t=t, interval=_num(data.get("interval")) or 1.0, source=source,
                  hostname=_str(data.get("hostname")), driver=_str(data.get("driver")),
                  reason=_str(data.get("reason")), gpus=tuple(gpus),
                  host=host_from_dict(host) if isinstance(host, dict) else None,
                  host_reason=_str(data.get("host_reason")))
