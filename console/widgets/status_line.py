"""A one-line status made of (text, meter style) parts: host state, source, sample age."""

from __future__ import annotations

from console.widgets.meter_base import MeterLine, MeterWidget


class StatusLine(MeterWidget):
    """One line; parts are coloured by their meter class (low/mid/high/stale/alert/label/...)."""

    DEFAULT_CSS = "StatusLine { height: 1; }"

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)
        self.parts: list[tuple[str, str]] = []

    def show(self, parts: list[tuple[str, str]]) -> None:
        if parts != self.parts:
            self.parts = parts
            self.redraw()

    @property
    def plain(self) -> str:
        return "".join(text for text, _ in self.parts)

    def lines(self) -> list[MeterLine]:
        t = MeterLine()
        for text, style in self.parts:
            t.append(text, self.mstyle(style) if style else None)
        return [t]
