"""Pane timers that tick only while their pane is on screen.

Every pane redraws (or polls its host) on a timer and does nothing while hidden, and five of
the six are hidden at any time: their timers would wake the app several times a second only to
find that out. A pane registers its timers here; they pause on Hide and resume on Show (the
pane's own on_show redraws at once, so nothing waits for the next tick)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from textual.timer import Timer

if TYPE_CHECKING:
    from textual.widget import Widget as _Base
else:
    _Base = object  # a plain mixin: a Widget base here would bring its own default CSS


class ShownTimers(_Base):
    """Mixin for panes (before the container class): `set_shown_interval` instead of
    `set_interval`."""

    _shown_timers: tuple[Timer, ...] = ()

    def set_shown_interval(self, interval: float, callback: Callable[[], object]) -> Timer:
        timer = self.set_interval(interval, callback, pause=not self.is_on_screen)
        self._shown_timers = (*self._shown_timers, timer)
        return timer

    def on_show(self) -> None:
        for timer in self._shown_timers:
            timer.resume()

    def on_hide(self) -> None:
        for timer in self._shown_timers:
            timer.pause()
