"""The host pane: the selected host's doctor report (what it can run) and its connection state."""

from __future__ import annotations

from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import VerticalScroll
from textual.widgets import Static

from console.errors import ConsoleError
from console.hosts.doctor_report import render
from console.hosts.engine_client import doctor
from console.ui.host_text import markup, plain
from console.ui.keymap import bindings
from console.ui.services import services


class OverviewPane(VerticalScroll):
    """Doctor report of the selected host; `r` refreshes it."""

    BINDINGS: ClassVar[list[BindingType]] = list(bindings("overview"))

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.host: str | None = None

    def compose(self) -> ComposeResult:
        yield Static("Select a host.", id="doctor-report")

    def show_host(self, host: str) -> None:
        self.host = host
        self.query_one("#doctor-report", Static).update(plain(f"Connecting to {host} …"))
        self.load_report(host)

    def action_refresh_report(self) -> None:
        if self.host:
            self.show_host(self.host)

    @work(exclusive=True, group="doctor")
    async def load_report(self, host: str) -> None:
        pool = services(self).pool
        report_widget = self.query_one("#doctor-report", Static)
        try:
            h = await pool.ensure(host)
            report = await doctor(h)
        except ConsoleError as e:
            report_widget.update(markup("[b]$host[/b]\n\n[$error]$e[/]", host=host, e=e))
            return
        if self.host == host:
            report_widget.update(plain(render(report)))
