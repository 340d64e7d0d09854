"""A DataTable whose string cells are text: what a host sent shows as written.

Textual's DataTable reads a `str` cell as markup, so a run whose code manifest was `[/b]` ended
the app. Every table of the console derives from TextTable; its rows may stay plain strings
(tests and the panes compare them), the table turns each into Text on the way in.

It also redraws itself when its columns change width. DataTable measures a changed cell's width
only when idle, and caches each drawn row under a count that measuring leaves alone: a frame drawn
between an update and that idle kept the old widths on screen until the next update
(a defect of Textual's DataTable), which showed as a column of the Runs pane out of line."""

from __future__ import annotations

from typing import Any

from textual.geometry import Size
from textual.widgets import DataTable
from textual.widgets.data_table import CellType, ColumnKey, RowKey

from console.ui.host_text import cell


class TextTable(DataTable[Any]):
    """DataTable with add_row / update_cell / update_cell_at taking str cells as text."""

    def watch_virtual_size(self, old: Size, new: Size) -> None:
        # a column's new width changes the table's width: rows drawn before it are stale
        if old.width != new.width:
            self._clear_caches()
            self.refresh()

    def add_row(self, *cells: CellType, height: int | None = 1, key: str | None = None,
                label: Any = None) -> RowKey:
        return super().add_row(*map(cell, cells), height=height, key=key, label=label)

    def update_cell(self, row_key: RowKey | str, column_key: ColumnKey | str, value: CellType,
                    *, update_width: bool = False) -> None:
        super().update_cell(row_key, column_key, cell(value), update_width=update_width)

    def update_cell_at(self, coordinate: Any, value: CellType, *,
                       update_width: bool = False) -> None:
        super().update_cell_at(coordinate, cell(value), update_width=update_width)
