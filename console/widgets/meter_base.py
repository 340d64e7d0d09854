"""MeterWidget: the base of the widgets that draw meters as text (GPU table and detail, host
strip, fleet, log charts, status lines). It declares the shared component classes, so one block
of themes/meters.tcss colours all of them from theme variables.

Subclasses build their content as `MeterLine`s (text runs with styles) in `lines()`; the base
turns them into Textual strips once per refresh and serves `render_line` from those. Going
straight to segments (no Rich Text layout, no wrapping) keeps a redraw cheap enough for panes
that repaint every second all day. `redraw()` (what new data calls) goes further: it compares
the new lines with those on screen and repaints only the lines that differ, or nothing.
"""

from __future__ import annotations

from typing import ClassVar

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

from console.text import visible


class MeterLine:
    """One line of styled text runs."""

    __slots__ = ("runs",)

    def __init__(self, text: str = "", style: Style | None = None) -> None:
        self.runs: list[tuple[str, Style | None]] = []
        if text:
            self.runs.append((visible(text), style))

    def append(self, text: str, style: Style | None = None) -> MeterLine:
        if text:   # a process name or a host's error: its control characters as ^X
            self.runs.append((visible(text), style))
        return self

    def extend(self, other: MeterLine) -> MeterLine:
        self.runs += other.runs
        return self

    def stylize(self, style: Style) -> MeterLine:
        """Add style on top of every run (a highlighted row)."""
        self.runs = [(t, s + style if s is not None else style) for t, s in self.runs]
        return self

    def pad(self, width: int) -> MeterLine:
        """Cut or pad with spaces to exactly width cells (charts side by side)."""
        out: list[tuple[str, Style | None]] = []
        left = width
        for t, s in self.runs:
            if left <= 0:
                break
            out.append((t[:left], s))
            left -= len(t[:left])
        if left > 0:
            out.append((" " * left, None))
        self.runs = out
        return self

    @property
    def plain(self) -> str:
        return "".join(t for t, _ in self.runs)

    def __len__(self) -> int:
        return sum(len(t) for t, _ in self.runs)


class MeterText:
    """Several MeterLines written as one stream: a "\n" in appended text starts a new line."""

    def __init__(self) -> None:
        self.lines: list[MeterLine] = [MeterLine()]

    def append(self, text: str, style: Style | None = None) -> MeterText:
        first, *rest = text.split("\n")
        self.lines[-1].append(first, style)
        for part in rest:
            self.lines.append(MeterLine(part, style))
        return self


class MeterWidget(Widget):
    """A widget whose content is a list of MeterLines, coloured by `meter--*` classes."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "meter--low", "meter--mid", "meter--high",   # a value's level (bars, numbers)
        "meter--empty",                              # the unfilled part of a bar
        "meter--stale",                              # data too old to trust: greyed
        "meter--alert",                              # STALE / LOST / error tags
        "meter--label", "meter--header",             # field names, column headers
        "meter--spark", "meter--spark2",             # history lines (two series)
        "meter--cursor",                             # the selected row
    }

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self._lines: list[MeterLine] | None = None   # what the strips were built from
        self._strips: list[Strip] | None = None
        self._width = -1                              # the width they were built for
        self._base = Style()
        self._styles: dict[str, Style] = {}

    def lines(self) -> list[MeterLine]:
        """The content, top to bottom (subclasses)."""
        return []

    def mstyle(self, name: str) -> Style:
        """The Rich style of component class `meter--<name>` (only what the theme sets)."""
        style = self._styles.get(name)
        if style is None:
            style = self._styles[name] = self.get_component_rich_style(f"meter--{name}",
                                                                       partial=True)
        return style

    def refresh(self, *regions: object, **kw: object) -> MeterWidget:
        if not regions:
            self._lines = self._strips = None  # rebuilt on the next render_line
        super().refresh(*regions, **kw)  # type: ignore[arg-type]
        return self

    def redraw(self, layout: bool = False) -> None:
        """Show what `lines()` says now, repainting only the lines that changed (none: no
        repaint at all). Before the first render, after a style change, or when the number of
        lines or the layout changes, a plain full refresh."""
        old = self._lines
        if layout or old is None or self._strips is None or self.size.width != self._width:
            self.refresh(layout=layout)
            return
        new = self.lines()
        if len(new) != len(old):
            self.refresh()
            return
        changed = [y for y, (a, b) in enumerate(zip(new, old, strict=True)) if a.runs != b.runs]
        if not changed:
            return
        self._lines = new
        for y in changed:
            self._strips[y] = self._strip(new[y])
        super().refresh(*(Region(0, y, self._width, 1) for y in changed))

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()  # a theme change: component colours are looked up again
        self._lines = self._strips = None

    def plain_lines(self) -> list[str]:
        return [ln.plain for ln in self.lines()]

    def _strip(self, line: MeterLine) -> Strip:
        base, width = self._base, self._width
        segments = [Segment(t, base + s if s is not None else base) for t, s in line.runs]
        cells = cell_len(line.plain)
        if cells <= width:  # pad here: one Strip, its length known
            if cells < width:
                segments.append(Segment(" " * (width - cells), base))
            return Strip(segments, width)
        # too long for the widget (a narrow terminal): cut, and say so with an ellipsis
        cut = Strip(segments).crop_extend(0, max(0, width - 1), base)
        return Strip([*cut, Segment("…" if width else "", base)], width)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if self._strips is None or width != self._width:
            self._base, self._width = self.rich_style, width
            self._lines = self.lines()
            self._strips = [self._strip(ln) for ln in self._lines]
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(width, self.rich_style)
