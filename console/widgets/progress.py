"""Textual's ProgressBar, idle while it is not on screen.

The stock bar animates its indeterminate state at 15 Hz and ticks its ETA every second even
when hidden, and the panes keep theirs hidden most of the time (behind `display = False` or in
a tab not shown): two such bars cost a third of the console's idle CPU. Here both timers run
only between Show and Hide; what is drawn is unchanged."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.events import Mount
from textual.timer import Timer
from textual.widgets import ProgressBar as _ProgressBar
from textual.widgets._progress_bar import Bar


class _QuietBar(Bar):
    """The bar part: animates its indeterminate state only while shown."""

    _shown = False

    def watch_percentage(self, percentage: float | None) -> None:
        self.auto_refresh = 1 / 15 if percentage is None and self._shown else None

    def on_show(self) -> None:
        self._shown = True
        self.watch_percentage(self.percentage)

    def on_hide(self) -> None:
        self._shown = False
        self.auto_refresh = None


class ProgressBar(_ProgressBar):
    """A ProgressBar whose timers stop while it is hidden."""

    _tick: Timer | None = None

    def compose(self) -> ComposeResult:
        for widget in super().compose():
            if type(widget) is Bar:
                # the base builds (and data-binds) its Bar; only its timer handling differs,
                # so the instance is re-classed rather than rebuilt (the arguments vary by version)
                widget.__class__ = _QuietBar
            yield widget

    def on_mount(self, event: Mount | None = None) -> None:
        # Textual passes the event; the base's handler (which takes none, hence the default)
        # would start the ETA tick unconditionally
        if event is not None:
            event.prevent_default()
        self.update()
        self._tick = self.set_interval(1, self.update, pause=True)
        self._clock.reset()

    def on_show(self) -> None:
        if self._tick is not None:
            self._tick.resume()

    def on_hide(self) -> None:
        if self._tick is not None:
            self._tick.pause()
