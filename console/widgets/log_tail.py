"""The last lines of a run's log, as many as fit, newest at the bottom; warnings and errors in
their theme colours (`tail--warning`, `tail--error`, `tail--dim` component classes). A line
longer than the widget wraps (a vLLM `SpecDecoding metrics` line ends in the figures that
matter); the rows that fit are the newest."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.widget import Widget

from console.runs.progress import LogLine
from console.text import terminal_text

#: the component class a log line of each level is drawn in (other levels: plain)
LEVEL_STYLE = {"warning": "tail--warning", "error": "tail--error", "debug": "tail--dim"}

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
        out = Text()
        h, width = max(1, self.size.height), max(1, self.size.width)
        shown = self.lines[-h:]   # at least a row each: no more can show
        if not shown:
            out.append("no output yet", self.get_component_rich_style("tail--dim", partial=True))
        for i, ln in enumerate(shown):
            if i:
                out.append("\n")
            if ln.t is not None:
                stamp = time.strftime("%H:%M:%S ", time.localtime(ln.t))
                out.append(stamp, self.get_component_rich_style("tail--dim", partial=True))
            style = LEVEL_STYLE.get(ln.level)
            out.append(terminal_text(ln.text), self.get_component_rich_style(style, partial=True)
                       if style else "")
        rows = out.wrap(self.app.console, width, overflow="fold")
        return Text("\n").join(rows[-h:])
