"""The detail view of one GPU: identity, clocks, PCIe, fan, performance state and ECC, and four
history lines (utilisation, memory, power, temperature) across the whole history window."""

from __future__ import annotations

from console.widgets.gpu_table import GpuRow
from console.widgets.meter_base import MeterLine, MeterText, MeterWidget
from console.widgets.meters import fmt_bytes, fmt_mem, fmt_num, spark


class GpuDetail(MeterWidget):
    """Everything about the highlighted GPU."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)
        self.row: GpuRow | None = None
        self.window: tuple[float, float] = (0.0, 1.0)
        self.window_label = ""

    def show(self, row: GpuRow | None, window: tuple[float, float], label: str) -> None:
        self.row, self.window, self.window_label = row, window, label
        self.redraw()

    def lines(self) -> list[MeterLine]:
        row = self.row
        if row is None:
            return [MeterLine("No GPU selected.", self.mstyle("stale"))]
        g = row.gpu
        grey = row.stale or row.error is not None
        lab, val = self.mstyle("label"), self.mstyle("stale") if grey else self.mstyle("spark")
        t = MeterText()
        t.append(f"GPU {g.index}  ", self.mstyle("header"))
        # the uuid (40 columns) only where the line has room for it and the figures after it
        uuid = f"{g.uuid}  " if g.uuid and self.size.width >= 120 else ""
        t.append(f"{g.name or '?'}  {uuid}", val)
        if row.error:
            t.append(f" {row.error} ", self.mstyle("alert"))
        elif row.stale:
            t.append(" STALE ", self.mstyle("alert"))
        for name, v in (("pstate", "—" if g.pstate is None else f"P{g.pstate}"),
                        ("fan", fmt_num(g.fan, "%")),
                        ("ECC uncorrected", fmt_num(g.ecc_uncorrected))):
            t.append(f"{name} ", lab)
            t.append(f"{v}  ", val)
        t.append("\n")
        for name, v in (("SM", fmt_num(g.sm_clock, " MHz")), ("MEM", fmt_num(g.mem_clock, " MHz")),
                        ("mem busy", fmt_num(g.mem_util, "%")),
                        ("PCIe", f"↓{fmt_bytes(g.pcie_rx, '/s')} "
                                 f"↑{fmt_bytes(g.pcie_tx, '/s')}")):
            t.append(f"{name} ", lab)
            t.append(f"{v}   ", val)
        width = max(10, self.size.width - 22)
        series = [
            ("util", [(p.t, p.util) for p in row.history], 100.0, fmt_num(g.util, "%")),
            ("memory", [(p.t, None if p.mem is None else p.mem * 100) for p in row.history], 100.0,
             fmt_mem(g.mem_used, g.mem_total)),
            ("power", [(p.t, p.power) for p in row.history], g.power_limit or 1000.0,
             fmt_num(g.power, " W")),
            ("temp", [(p.t, p.temp) for p in row.history], 100.0, fmt_num(g.temp, "°C")),
        ]
        for name, points, vmax, now_text in series:
            t.append("\n")
            t.append(f"{name:<7}", lab)
            t.append(spark(points, *self.window, width, vmax), self.mstyle("stale") if grey
                     else self.mstyle("spark"))
            t.append(f" {now_text:>13}", val)
        t.append("\n")
        t.append(f"{'':<7}" + f"← {self.window_label}".ljust(max(0, width - 3)) + "now", lab)
        return t.lines
