"""The GPU process table: every process holding GPU memory on the host, with its GPU, sortable
by any column (`s` on its pane cycles the sort key, clicking a header sorts by it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from console.monitor.record import GpuProcess
from console.widgets.meters import fmt_bytes
from console.widgets.text_table import TextTable

# (column label, sort key, largest first?)
COLUMNS: list[tuple[str, Callable[[GpuProcess], Any], bool]] = [
    ("GPU", lambda p: p.gpu, False),
    ("PID", lambda p: p.pid, False),
    ("USER", lambda p: p.user or "", False),
    ("GPU MEM", lambda p: p.gpu_mem or 0, True),
    ("TYPE", lambda p: p.type, False),
    ("COMMAND", lambda p: p.cmd or "", False),
]


class ProcessTable(TextTable):
    """GPU processes; the sort survives refreshes."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kw)
        self.sort_column = 3  # GPU memory, largest first: who is holding the memory
        self.procs: list[GpuProcess] = []
        self.grey = False

    def on_mount(self) -> None:
        self._add_columns()

    def _add_columns(self) -> None:
        for i, (label, _key, desc) in enumerate(COLUMNS):
            mark = (" ▼" if desc else " ▲") if i == self.sort_column else ""
            self.add_column(Text(label + mark), key=label)

    def show(self, procs: list[GpuProcess], grey: bool) -> None:
        if procs == self.procs and grey == self.grey:
            return
        self.procs, self.grey = procs, grey
        self._fill()

    def _fill(self) -> None:
        _label, key, desc = COLUMNS[self.sort_column]
        rows = sorted(self.procs, key=key, reverse=desc)
        cursor = self.cursor_row
        self.clear()
        for p in rows:
            self.add_row(str(p.gpu), str(p.pid), p.user or "?",
                         fmt_bytes(p.gpu_mem) if p.gpu_mem is not None else "n/a", p.type,
                         p.cmd or "?", key=f"{p.gpu}:{p.pid}")
        if rows:
            self.move_cursor(row=min(cursor, len(rows) - 1))
        self.set_class(self.grey, "-stale")

    def sort_by(self, column: int) -> None:
        self.sort_column = column % len(COLUMNS)
        self.clear(columns=True)  # labels carry the sort mark; widths follow them
        self._add_columns()
        self._fill()

    def action_cycle_sort(self) -> None:
        self.sort_by(self.sort_column + 1)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        self.sort_by(event.column_index)
