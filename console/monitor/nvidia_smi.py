"""The monitor fallback for hosts that cannot run the engine's agent yet: one shell round trip
that runs `nvidia-smi --query-gpu/--query-compute-apps ... --format=csv,noheader,nounits`, `ps`
for the process owners, and reads /proc for the host, mapped to the agent's record.

What nvidia-smi cannot give (PCIe throughput; per-process data of other PID namespaces) is None,
exactly as the agent reports a field a GPU does not support. Unavailable values (`[N/A]`,
`[Not Supported]`, `[GPU requires reset]`, ...) become None; a GPU that fell off the bus prints
an `Unable to determine the device handle` line instead of its row: it is missing from the
sample (the pane then shows its last data as stale) and the line is kept in `Sample.reason`.
"""

from __future__ import annotations

import csv
import functools
import re
from dataclasses import replace
from importlib import resources
from typing import Any

from console.monitor.proc_stats import ProcStats
from console.monitor.record import GpuProcess, GpuStat, Sample
from console.transport.base import quote

QUERY_GPU = ("index", "name", "uuid", "utilization.gpu", "utilization.memory", "memory.used",
             "memory.total", "temperature.gpu", "power.draw", "enforced.power.limit", "clocks.sm",
             "clocks.mem", "fan.speed", "ecc.errors.uncorrected.volatile.total", "pstate")
QUERY_APPS = ("gpu_uuid", "pid", "process_name", "used_memory")
MIB = 2 ** 20

#: the fallback's one round trip, a template in the package data (the host-side folder): see
#: script()
SCRIPT_PACKAGE, SCRIPT_NAME = "console.hostside", "nvidia_smi_fallback.sh"
_TOKEN = re.compile(r"@(QUERY_GPU|QUERY_APPS|DISK_PATH)@")


@functools.cache
def _template() -> str:
    """console/hostside/nvidia_smi_fallback.sh less its leading comment lines."""
    text = resources.files(SCRIPT_PACKAGE).joinpath(SCRIPT_NAME).read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        del lines[0]
    return "".join(lines)


def script(disk_path: str) -> str:
    """The fallback's shell script for a host (disk use reported for disk_path): the template
    with its @NAME@ tokens filled in one pass (a value is never read as a token)."""
    values = {"QUERY_GPU": ",".join(QUERY_GPU), "QUERY_APPS": ",".join(QUERY_APPS),
              "DISK_PATH": quote(disk_path)}
    return _TOKEN.sub(lambda m: values[m.group(1)], _template())


def _value(text: str) -> str | None:
    """One CSV cell; None for nvidia-smi's bracketed "no value" markers and empty cells."""
    text = text.strip()
    if not text or (text.startswith("[") and text.endswith("]")) or text in ("N/A", "Unknown"):
        return None
    return text


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _int(text: str | None) -> int | None:
    v = _float(text)
    return int(v) if v is not None else None


def _rows(text: str, width: int) -> tuple[list[list[str]], list[str]]:
    """CSV rows of exactly `width` cells, and the other non-empty lines (nvidia-smi's errors)."""
    rows, other = [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = next(csv.reader([line], skipinitialspace=True), [])
        if len(cells) == width:
            rows.append(cells)
        else:
            other.append(line.strip())
    return rows, other


def parse_gpus(text: str) -> tuple[list[GpuStat], list[str]]:
    """`--query-gpu=QUERY_GPU` output -> GPU records (without processes), and unparsed lines."""
    rows, other = _rows(text, len(QUERY_GPU))
    gpus = []
    for cells in rows:
        v: dict[str, Any] = dict(zip(QUERY_GPU, (_value(c) for c in cells), strict=False))
        index = _int(v["index"])
        if index is None:
            other.append(", ".join(cells))
            continue
        pstate = v["pstate"]
        mem_used, mem_total = _float(v["memory.used"]), _float(v["memory.total"])
        gpus.append(GpuStat(
            index=index, name=v["name"], uuid=v["uuid"],
            util=_float(v["utilization.gpu"]), mem_util=_float(v["utilization.memory"]),
            mem_used=int(mem_used * MIB) if mem_used is not None else None,
            mem_total=int(mem_total * MIB) if mem_total is not None else None,
            temp=_float(v["temperature.gpu"]), power=_float(v["power.draw"]),
            power_limit=_float(v["enforced.power.limit"]), sm_clock=_int(v["clocks.sm"]),
            mem_clock=_int(v["clocks.mem"]), fan=_float(v["fan.speed"]),
            ecc_uncorrected=_int(v["ecc.errors.uncorrected.volatile.total"]),
            pstate=int(pstate[1:]) if pstate and pstate[:1] == "P" and pstate[1:].isdigit()
            else None))
    return gpus, other


def parse_apps(text: str) -> list[tuple[str, int, str | None, int | None]]:
    """`--query-compute-apps=QUERY_APPS` -> (gpu uuid, pid, process name, used bytes)."""
    rows, _other = _rows(text, len(QUERY_APPS))
    out = []
    for uuid, pid, name, mem in rows:
        p = _int(_value(pid))
        if p is None:
            continue
        used = _float(_value(mem))
        out.append((uuid.strip(), p, _value(name), int(used * MIB) if used is not None else None))
    return out


def parse_ps(text: str) -> dict[int, tuple[str, str]]:
    """`ps -o pid=,user=,args=` -> {pid: (user, command line)}."""
    out = {}
    for line in text.splitlines():
        parts = line.split(None, 2)
        if len(parts) >= 2 and parts[0].isdigit():
            out[int(parts[0])] = (parts[1], parts[2] if len(parts) > 2 else "")
    return out


def with_processes(gpus: list[GpuStat], apps: list[tuple[str, int, str | None, int | None]],
                   owners: dict[int, tuple[str, str]]) -> list[GpuStat]:
    """GPU records with their processes attached (apps name GPUs by uuid)."""
    by_uuid: dict[str, list[GpuProcess]] = {}
    index = {g.uuid: g.index for g in gpus if g.uuid}
    for uuid, pid, name, used in apps:
        if uuid not in index:
            continue
        user, cmd = owners.get(pid, (None, None))
        by_uuid.setdefault(uuid, []).append(GpuProcess(gpu=index[uuid], pid=pid, user=user,
                                                       cmd=cmd or name, gpu_mem=used))
    return [replace(g, procs=tuple(by_uuid.get(g.uuid or "", ()))) for g in gpus]


def split_sections(output: str) -> dict[str, str]:
    """The script's output -> {section name: text}; the `@@gpu RC` header keeps RC as `gpu_rc`."""
    sections: dict[str, list[str]] = {}
    current = ""
    for line in output.splitlines():
        if line.startswith("@@"):
            head = line[2:].split()
            current = head[0] if head else ""
            sections[current] = []
            if current == "gpu" and len(head) > 1:
                sections["gpu_rc"] = [head[1]]
            continue
        sections.setdefault(current, []).append(line)
    return {k: "\n".join(v) for k, v in sections.items()}


def _no_gpu_reason(rc: str, text: str) -> str:
    if rc == "127" or "not found" in text:
        return "nvidia-smi not found on this host"
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return f"nvidia-smi failed (exit {rc}): {first}" if first else f"nvidia-smi failed (exit {rc})"


class NvidiaSmiSampler:
    """Parses successive outputs of `script()` into Samples (host rates need the previous one)."""

    def __init__(self, interval: float, disk_path: str) -> None:
        self.interval = interval
        self.disk_path = disk_path
        self.proc = ProcStats()

    def script(self) -> str:
        return script(self.disk_path)

    def parse(self, output: str, t: float) -> Sample:
        s = split_sections(output)
        rc = s.get("gpu_rc", "")
        gpus, other = parse_gpus(s.get("gpu", ""))
        reason = None
        if not gpus:
            reason = (_no_gpu_reason(rc, s.get("gpu", "")) if rc != "0"
                      else "nvidia-smi found no GPUs")
        elif other:
            reason = "; ".join(other)   # e.g. a lost GPU's "Unable to determine the device handle"
        gpus = with_processes(gpus, parse_apps(s.get("apps", "")), parse_ps(s.get("ps", "")))
        host = None
        if s.get("stat") or s.get("mem"):
            host = self.proc.host(t, s.get("stat", ""), s.get("load", ""), s.get("mem", ""),
                                  s.get("net", ""), s.get("df", ""), self.disk_path)
        return Sample(t=t, interval=self.interval, source="nvidia-smi", reason=reason,
                      gpus=tuple(gpus), host=host,
                      host_reason=None if host else "no /proc on this host")
