"""The host strip: per-core CPU (one cell per core), load, memory, swap, disk use of the host's
root and network rates, in two lines."""

from __future__ import annotations

from rich.style import Style

from console.monitor.record import HostStat
from console.widgets.meter_base import MeterLine, MeterText, MeterWidget
from console.widgets.meters import bar, fmt_bytes, fmt_mem, level

_SPARK = "▁▂▃▄▅▆▇█"
# (disk path width, bar width, gap) of the resources line, widest first
_LAYOUTS = [(20, 6, "  "), (12, 4, "  "), (10, 3, " "), (8, 0, " ")]


def core_cells(cpu: tuple[float, ...], width: int) -> list[float]:
    """Per-core % folded into at most `width` cells (each the busiest core of its group)."""
    if len(cpu) <= width:
        return list(cpu)
    group = -(-len(cpu) // width)
    return [max(cpu[i:i + group]) for i in range(0, len(cpu), group)]


def short_path(path: str, width: int = 20) -> str:
    """The end of a long path (the part that names it): …/eagle3-console/host."""
    return path if len(path) <= width else "…" + path[-(width - 1):]


class HostStrip(MeterWidget):
    """CPU, memory, swap, disk and network of the selected host."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)
        self.host: HostStat | None = None
        self.reason: str | None = None
        self.grey = False

    def show(self, host: HostStat | None, reason: str | None, grey: bool) -> None:
        self.host, self.reason, self.grey = host, reason, grey
        self.redraw()

    def lines(self) -> list[MeterLine]:
        h = self.host
        if h is None:
            return [MeterLine(f"host: {self.reason or 'no data yet'}", self.mstyle("stale"))]
        lab = self.mstyle("label")
        t = MeterText()
        avg = h.cpu_avg
        t.append("CPU ", lab)
        tail = f" {avg:.0f}% of {len(h.cpu)}" if avg is not None else " —"
        load = "  load " + " ".join(f"{x:.1f}" for x in h.load) if h.load else ""
        cells = core_cells(h.cpu, max(8, self.size.width - 4 - len(tail) - len(load) - 1))
        for c in cells:
            t.append(_SPARK[min(7, int(c / 100 * 8))], self._val(c / 100))
        t.append(tail, self._val())
        t.append(load, lab)
        for layout in _LAYOUTS:   # a narrow pane: shorter path and bars, figures kept
            second = self._resources(h, *layout)
            if len(second) <= self.size.width:
                break
        return [t.lines[0], second]

    def _val(self, frac: float | None = None) -> Style:
        return self.mstyle("stale" if self.grey else level(frac) if frac is not None
                           else "spark")

    def _resources(self, h: HostStat, path_w: int, bar_w: int, gap: str) -> MeterLine:
        """Memory, swap, disk (its path cut to path_w) and network, on one line."""
        lab = self.mstyle("label")
        t = MeterLine()

        def meter(name: str, used: int | None, total: int | None, width: int = bar_w) -> None:
            frac = used / total if used is not None and total else None
            filled, empty = bar(frac, width) if width else ("", "")
            t.append(f"{name} ", lab)
            t.append(filled, self._val(frac))
            t.append(empty + " " if width else "", self.mstyle("empty"))
            t.append(f"{fmt_mem(used, total)}{gap}", self._val())

        meter("MEM", h.mem_used, h.mem_total)
        if h.swap_total:
            meter("SWAP", h.swap_used, h.swap_total, bar_w * 2 // 3)
        else:
            t.append("SWAP ", lab)
            t.append(f"none{gap}", self._val())
        path = short_path(h.disk_path or "?", path_w)
        if h.disk_error:
            t.append("DISK ", lab)
            t.append(f"{path}: {h.disk_error}{gap}", self._val())
        else:
            meter(f"DISK {path}", h.disk_used, h.disk_total)
        t.append("NET ", lab)
        t.append(f"↓{fmt_bytes(h.net_rx, '/s')} ↑{fmt_bytes(h.net_tx, '/s')}", self._val())
        return t
