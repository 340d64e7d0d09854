"""The checkpoints table: a host's checkpoints (CHECKPOINT, SIZE, MODIFIED) with their paths
fitted to the table's width, the end (the drafter's own name) kept."""

from __future__ import annotations

import time
from typing import Any, ClassVar

from textual.binding import BindingType

from console.checkpoints.results import Checkpoint
from console.ui.keymap import bindings
from console.widgets.meters import fmt_bytes
from console.widgets.text_table import TextTable

COLUMNS = ("CHECKPOINT", "SIZE", "MODIFIED")


def display_path(ck: Checkpoint, root: str) -> str:
    """Run outputs and conversions relative to the host root (runs/..., converted/...);
    configured folders in full."""
    if ck.path.startswith(root.rstrip("/") + "/"):
        return ck.path[len(root.rstrip("/")) + 1:]
    return ck.path


def fit_path(path: str, room: int) -> str:
    """`path` in `room` columns: its end (the drafter's own name) kept, the start cut to `…`."""
    if room <= 0 or len(path) <= room:
        return path
    return "…" + path[len(path) - room + 1:]


def ckpt_row(ck: Checkpoint, root: str, room: int = 0) -> tuple[str, str, str]:
    """CHECKPOINT (fitted to `room` columns, 0: whole), SIZE, MODIFIED."""
    return (fit_path(display_path(ck, root), room), fmt_bytes(ck.bytes),
            time.strftime("%m-%d %H:%M", time.localtime(ck.mtime)))


def path_room(width: int, rows: list[tuple[str, str, str]]) -> int:
    """Columns left for CHECKPOINT in a table `width` wide (0: unknown, show whole paths):
    SIZE and MODIFIED as wide as their widest cell or header, each column padded 1 a side."""
    if width <= 0:
        return 0
    size_w = max([len(COLUMNS[1])] + [len(r[1]) for r in rows])
    mod_w = max([len(COLUMNS[2])] + [len(r[2]) for r in rows])
    return max(12, width - size_w - mod_w - 3 * 2)


class CheckpointTable(TextTable):
    """Checkpoints of the selected host; enter inspects the one under the cursor."""

    BINDINGS: ClassVar[list[BindingType]] = list(bindings("checkpoints", on="CheckpointTable"))

    def __init__(self, **kw: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kw)
        self.paths: list[str] = []
        self.rows_shown: list[tuple[str, ...]] = []

    def on_mount(self) -> None:
        self.add_columns(*COLUMNS)

    def show_checkpoints(self, found: list[Checkpoint], root: str) -> None:
        """The rows of `found`, paths fitted to the width the table has now."""
        whole = [ckpt_row(c, root) for c in found]
        width = self.scrollable_content_region.width
        most = self.styles.max_height   # more rows than it shows: a scrollbar takes columns
        if width and most is not None and len(found) + 1 > most.value \
                and not self.show_vertical_scrollbar:   # (a shown one is not in `width`)
            width -= self.styles.scrollbar_size_vertical
        room = path_room(width, whole)
        self.show([c.path for c in found], [ckpt_row(c, root, room) for c in found])

    def show(self, paths: list[str], rows: list[tuple[str, ...]]) -> None:
        if paths == self.paths and rows == self.rows_shown:
            return
        selected = self.selected
        self.paths, self.rows_shown = paths, rows
        self.clear()
        for p, r in zip(paths, rows, strict=False):
            self.add_row(*r, key=p)
        if selected in paths:
            self.move_cursor(row=paths.index(selected))

    def select(self, path: str) -> None:
        if path in self.paths:
            self.move_cursor(row=self.paths.index(path))

    @property
    def selected(self) -> str | None:
        if not self.paths or self.cursor_row < 0:
            return None
        return self.paths[min(self.cursor_row, len(self.paths) - 1)]
