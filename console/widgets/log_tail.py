"""The last lines of a run's log, as many as fit, newest at the bottom; warnings and errors in
their theme colours (`tail--warning`, `tail--error`, `tail--dim` component classes)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.widget import Widget

from console.runs.progress import LogLine
from console.text import terminal_text


class LogTail(Widget):
    """Render-only: `show(lines)` replaces what is drawn."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"tail--warning", "tail--error", "tail--dim"}

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.lines: list[LogLine] = []

    def show(self, lines: Sequence[LogLine]) -> None:
        self.lines = list(lines)
        self.refresh()

    def render(self) -> Text:
        out = Text(no_wrap=True, overflow="ellipsis")
        h = max(1, self.size.height)
        shown = self.lines[-h:]
        if not shown:
            out.append("no output yet", self.get_component_rich_style("tail--dim", partial=True))
        for i, ln in enumerate(shown):
            if i:
                out.append("\n")
            if ln.t is not None:
                stamp = time.strftime("%H:%M:%S ", time.localtime(ln.t))
                out.append(stamp, self.get_component_rich_style("tail--dim", partial=True))
            style = {"warning": "tail--warning", "error": "tail--error",
                     "debug": "tail--dim"}.get(ln.level)
            out.append(terminal_text(ln.text), self.get_component_rich_style(style, partial=True)
                       if style else "")
        return out
