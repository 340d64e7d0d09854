"""The fleet pane: every configured host's GPUs, one line per GPU, from the monitor service.

Showing it starts the monitor on every host (each over its own connection); like the GPU pane
it redraws from the monitors on a one-second timer and never waits on a host. A Slurm host
(`scheduler = "slurm"`) also shows its partitions, from sinfo every PARTITIONS_S seconds."""

from __future__ import annotations

from textual import work
from textual.app import ComposeResult
from textual.containers import VerticalScroll

from console.panes.timers import ShownTimers
from console.ui.services import services
from console.widgets.fleet_table import FleetTable, fleet_host

WINDOW_S = 300.0
PARTITIONS_S = 15.0


class FleetPane(ShownTimers, VerticalScroll):
    """All hosts at a glance."""

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self._drawn: tuple[object, ...] = ()
        self.partitions: dict[str, list[str]] = {}   # Slurm host -> sinfo lines

    def compose(self) -> ComposeResult:
        yield FleetTable(id="fleet-table")

    def on_mount(self) -> None:
        self.set_shown_interval(1.0, self.refresh_view)
        self.set_shown_interval(PARTITIONS_S, self.load_partitions)

    def show_host(self, host: str) -> None:
        """The fleet shows every host whichever is selected."""

    def on_show(self) -> None:
        services(self).monitors.watch_all()
        self.load_partitions()
        self.refresh_view(force=True)

    @work(exclusive=True, group="fleet-sinfo", exit_on_error=False)
    async def load_partitions(self) -> None:
        from console.errors import ConsoleError
        from console.scheduler.slurm import partitions
        config = services(self).config
        for name, cfg in config.hosts.items():
            if cfg.scheduler != "slurm":
                continue
            try:
                host = await services(self).pool.ensure(name)
                self.partitions[name] = [p.text() for p in await partitions(host)] or \
                    ["no partitions"]
            except ConsoleError as e:
                self.partitions[name] = [f"sinfo: {e}"]
        self.refresh_view(force=True)

    def refresh_view(self, force: bool = False) -> None:
        if not (force or self.is_on_screen):
            return
        hub = services(self).monitors
        now: float = services(self).clock()
        key = (tuple(m.version for m in hub.monitors.values()), int(now),
               tuple(map(tuple, self.partitions.values())))
        if key == self._drawn and not force:
            return
        self._drawn = key
        self.query_one(FleetTable).show([fleet_host(m, now, self.partitions.get(m.name))
                                         for m in hub.monitors.values()],
                                        (now - WINDOW_S, now))
