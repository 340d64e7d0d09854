"""The GPU table: one compact row per GPU (utilisation, memory, power and temperature as bars
with numbers, then a utilisation sparkline over the history window). Stale rows are greyed and
tagged; a lost GPU is tagged LOST. Up/down moves the cursor that picks the detail view's GPU."""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import ClassVar

from textual.binding import BindingType
from textual.message import Message
from textual.reactive import reactive

from console.monitor.record import GpuStat
from console.monitor.service import GpuPoint
from console.ui.keymap import bindings
from console.widgets.meter_base import MeterLine, MeterWidget
from console.widgets.meters import bar, fmt_mem, fmt_num, level, spark


@dataclass
class GpuRow:
    """What one row shows."""

    gpu: GpuStat
    stale: bool = False
    error: str | None = None
    history: list[GpuPoint] = field(default_factory=list)


# bar widths: utilisation, memory, power, temperature; a narrow pane (80 columns) takes the
# second set, so the history keeps room for its label: figures and history before long bars
_BARS = (8, 8, 6, 4)
_NARROW_BARS = (5, 5, 3, 2)
_T_UTIL = attrgetter("t", "util")  # a history point as the sparkline's (t, value)
_TEMP_MAX = 100.0


class GpuTable(MeterWidget, can_focus=True):
    """Rows of GPUs; posts CursorMoved when the selection changes."""

    BINDINGS: ClassVar[list[BindingType]] = list(bindings("gpu", on="GpuTable"))

    cursor: reactive[int] = reactive(0)

    class CursorMoved(Message):
        """The highlighted GPU changed."""

        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)
        self.rows: list[GpuRow] = []
        self.window: tuple[float, float] = (0.0, 1.0)
        self.history_label = "UTIL HISTORY"
        self.empty_text = "No data yet."

    def show(self, rows: list[GpuRow], window: tuple[float, float], label: str,
             empty_text: str = "No GPUs.") -> None:
        resized = len(rows) != len(self.rows)
        self.rows, self.window = rows, window
        self.history_label, self.empty_text = label, empty_text
        if rows and self.cursor >= len(rows):
            self.cursor = len(rows) - 1
        self.redraw(layout=resized)  # a layout pass only when the number of rows changed

    @property
    def selected(self) -> GpuRow | None:
        return self.rows[self.cursor] if 0 <= self.cursor < len(self.rows) else None

    def action_move(self, delta: int) -> None:
        if self.rows:
            self.cursor = max(0, min(len(self.rows) - 1, self.cursor + delta))

    def watch_cursor(self, index: int) -> None:
        self.post_message(self.CursorMoved(index))
        self.redraw()

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()

    def get_content_height(self, container: object, viewport: object, width: int) -> int:
        return 1 + max(1, len(self.rows))

    # -- drawing --------------------------------------------------------------------------------
    def lines(self) -> list[MeterLine]:
        width = max(40, self.size.width)
        idx_w = len(str(max((r.gpu.index for r in self.rows), default=0))) + 2
        for bars in (_BARS, _NARROW_BARS):
            ub, mb, pb, tb = bars
            fixed = idx_w + (ub + 5) + 1 + (mb + 10) + 1 + (pb + 9) + 1 + (tb + 6) + 2 + 6
            spark_w = max(0, width - fixed)
            if spark_w >= len(self.history_label):
                break
        head = MeterLine(" " * idx_w + "UTIL".ljust(ub + 6) + "MEMORY".ljust(mb + 11)
                    + "POWER".ljust(pb + 10) + "TEMP".ljust(tb + 7)
                    + self.history_label[:spark_w].ljust(spark_w), self.mstyle("header"))
        if not self.rows:
            # up to two lines (the table's empty height): what is missing, and why
            return [MeterLine(t, self.mstyle("stale")) for t in self.empty_text.split("\n")[:2]]
        return [head] + [self._row(row, i == self.cursor, idx_w, spark_w, bars)
                         for i, row in enumerate(self.rows)]

    def _row(self, row: GpuRow, is_cursor: bool, idx_w: int, spark_w: int,
             bars: tuple[int, int, int, int]) -> MeterLine:
        g = row.gpu
        grey = row.stale or row.error is not None
        t = MeterLine()
        t.append(f"{'▶' if is_cursor else ' '}{g.index}".ljust(idx_w), self.mstyle("label"))

        def meter(frac: float | None, width: int, number: str, num_w: int) -> None:
            filled, empty = bar(frac, width)
            t.append(filled, self.mstyle("stale" if grey else level(frac)))
            t.append(empty, self.mstyle("empty"))
            t.append(" " + number.rjust(num_w), self.mstyle("stale") if grey else None)
            t.append(" ")

        ub, mb, pb, tb = bars
        util = None if g.util is None else g.util / 100
        meter(util, ub, fmt_num(g.util, "%"), 4)
        meter(g.mem_frac, mb, fmt_mem(g.mem_used, g.mem_total), 9)
        p = g.power / g.power_limit if g.power is not None and g.power_limit else None
        power = (f"{g.power:.0f}/{g.power_limit:.0f}W" if g.power is not None and g.power_limit
                 else fmt_num(g.power, "W"))
        meter(p, pb, power, 8)
        meter(None if g.temp is None else g.temp / _TEMP_MAX, tb, fmt_num(g.temp, "°C"), 4)
        t.append(" ")
        hist = spark(map(_T_UTIL, row.history), *self.window, spark_w, 100.0)
        t.append(hist, self.mstyle("stale" if grey else "spark"))
        t.append(" ")
        if row.error is not None:
            t.append("LOST".ljust(6), self.mstyle("alert"))
        elif row.stale:
            t.append("STALE".ljust(6), self.mstyle("alert"))
        if is_cursor and self.has_focus:
            t.stylize(self.mstyle("cursor"))
        return t
