"""The fleet table: every configured host's GPUs at a glance, one line per GPU under a line per
host (state, GPU model, sample age). A host without GPUs gets one line saying why. A Slurm
cluster's login node gets one line per partition (nodes, idle, free GPUs: sinfo) instead."""

from __future__ import annotations

from dataclasses import dataclass, field

from console.monitor.service import HostMonitor, MonitorState
from console.widgets.gpu_table import _T_UTIL, GpuRow
from console.widgets.meter_base import MeterLine, MeterWidget
from console.widgets.meters import bar, fmt_age, fmt_mem, fmt_num, level, spark

_UB, _MB = 6, 6


@dataclass
class FleetHost:
    """One host's block."""

    name: str
    state: MonitorState
    detail: str
    age: float | None
    stale: bool
    reason: str | None
    source: str | None
    rows: list[GpuRow] = field(default_factory=list)
    partitions: list[str] = field(default_factory=list)  # a Slurm host: sinfo, one a line

    @property
    def height(self) -> int:
        return 1 + len(self.partitions) + (max(1, len(self.rows)) if not self.partitions
                                           else len(self.rows))


def fleet_host(mon: HostMonitor, now: float, partitions: list[str] | None = None) -> FleetHost:
    down = mon.state is MonitorState.RECONNECTING or mon.stale(now)
    rows = [GpuRow(g, stale=down or mon.gpu_stale(g.index, now), error=mon.gpu_error.get(g.index),
                   history=list(mon.history.get(g.index, ()))) for g in mon.gpu_list()]
    s = mon.sample
    return FleetHost(mon.name, mon.state, mon.detail, mon.age(now), mon.stale(now),
                     s.reason if s else None, s.source if s else None, rows,
                     list(partitions or []))


class FleetTable(MeterWidget):
    """All hosts, one line per GPU."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)
        self.hosts: list[FleetHost] = []
        self.window: tuple[float, float] = (0.0, 1.0)

    def show(self, hosts: list[FleetHost], window: tuple[float, float]) -> None:
        resized = [h.height for h in hosts] != [h.height for h in self.hosts]
        self.hosts, self.window = hosts, window
        self.redraw(layout=resized)

    def get_content_height(self, container: object, viewport: object, width: int) -> int:
        return sum(h.height for h in self.hosts) or 1

    def lines(self) -> list[MeterLine]:
        width = max(60, self.size.width)
        out: list[MeterLine] = []
        for h in self.hosts:
            out.append(self._host_line(h))
            for text in h.partitions:  # a cluster: its login node has no GPUs of its own
                out.append(MeterLine(f"   {text}", self.mstyle("label")))
            if not h.rows and not h.partitions:
                why = h.reason or ("waiting for the first sample" if h.state is not
                                   MonitorState.RECONNECTING else "no data")
                out.append(MeterLine(f"   no GPUs: {why}", self.mstyle("stale")))
            for r in h.rows:
                out.append(self._gpu_line(r, width))
        return out or [MeterLine("No hosts configured.")]

    def _host_line(self, h: FleetHost) -> MeterLine:
        t = MeterLine()
        t.append(f"{h.name} ", self.mstyle("header"))
        if h.state is MonitorState.RECONNECTING:
            t.append("◌ reconnecting", self.mstyle("alert"))
            t.append(f"  · last data {fmt_age(h.age)} · {h.detail}", self.mstyle("stale"))
            return t
        if h.state is MonitorState.STARTING:
            t.append("◌ starting", self.mstyle("label"))
            return t
        if h.stale:
            t.append(f"● STALE ({fmt_age(h.age)})", self.mstyle("alert"))
        else:
            t.append("● live", self.mstyle("low"))
        names = sorted({r.gpu.name for r in h.rows if r.gpu.name})
        if h.rows:
            t.append(f"  {len(h.rows)} × {', '.join(names) or 'GPU'}", self.mstyle("label"))
        if h.source == "nvidia-smi":
            t.append("  (nvidia-smi)", self.mstyle("mid"))
        return t

    def _gpu_line(self, r: GpuRow, width: int) -> MeterLine:
        g = r.gpu
        grey = r.stale or r.error is not None
        t = MeterLine()
        t.append(f"  {g.index:>2} ", self.mstyle("label"))

        def meter(frac: float | None, w: int) -> None:
            filled, empty = bar(frac, w)
            t.append(filled, self.mstyle("stale" if grey else level(frac)))
            t.append(empty, self.mstyle("empty"))

        num = self.mstyle("stale") if grey else None
        meter(None if g.util is None else g.util / 100, _UB)
        t.append(f" {fmt_num(g.util, '%'):>4}  ", num)
        meter(g.mem_frac, _MB)
        t.append(f" {fmt_mem(g.mem_used, g.mem_total):>9}  ", num)
        t.append(f"{fmt_num(g.power, 'W'):>5} {fmt_num(g.temp, '°C'):>5}  ", num)
        spark_w = max(8, min(30, width - 78))
        t.append(spark(map(_T_UTIL, r.history), *self.window, spark_w, 100.0),
                 self.mstyle("stale" if grey else "spark"))
        if r.error is not None:
            t.append(" LOST ", self.mstyle("alert"))
        elif r.stale:
            t.append(" STALE", self.mstyle("alert"))
        else:
            t.append("      ")
        top = max(g.procs, key=lambda p: p.gpu_mem or 0, default=None)
        if top is not None:
            t.append(_who(top.cmd, top.user, len(g.procs), width - len(t)),
                     self.mstyle("label"))
        return t


def _who(cmd: str | None, user: str | None, procs: int, room: int) -> str:
    """The GPU's biggest process (` vllm root +2`) in `room` columns: names are what a narrow
    line gives up first (the user, then the command's start), never the figures before them."""
    name = (cmd or "?").split()[0][-18:]
    more = f" +{procs - 1}" if procs > 1 else ""
    for text in (f" {name} {(user or '?')[:8]}{more}", f" {name}{more}"):
        if len(text) <= room:
            return text
    keep = room - len(more) - 2
    return f" …{name[-keep:]}{more}" if keep >= 4 else ""
