"""The fleet pane: every configured host's GPUs, one line per GPU, from the monitor service.

Showing it starts the monitor on every host (each over its own connection); like the GPU pane
it redraws from the monitors on a one-second timer and never waits on a host."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll

from console.panes.timers import ShownTimers
from console.widgets.fleet_table import FleetTable, fleet_host

WINDOW_S = 300.0


class FleetPane(ShownTimers, VerticalScroll):
    """All hosts at a glance."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self._drawn: tuple[object, ...] = ()

    def compose(self) -> ComposeResult:
        yield FleetTable(id="fleet-table")

    def on_mount(self) -> None:
        self.set_shown_interval(1.0, self.refresh_view)

    def show_host(self, host: str) -> None:
        """The fleet shows every host whichever is selected."""

    def on_show(self) -> None:
        self.app.monitors.watch_all()  # type: ignore[attr-defined]
        self.refresh_view(force=True)

    def refresh_view(self, force: bool = False) -> None:
        if not (force or self.is_on_screen):
            return
        hub = self.app.monitors  # type: ignore[attr-defined]
        now: float = self.app.clock()  # type: ignore[attr-defined]
        key = (tuple(m.version for m in hub.monitors.values()), int(now))
        if key == self._drawn and not force:
            return
        self._drawn = key
        self.query_one(FleetTable).show([fleet_host(m, now) for m in hub.monitors.values()],
                                        (now - WINDOW_S, now))
