"""The host pane: the selected host's doctor report (what it can run) and its connection state."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.console import Group
from rich.table import Table
from textual import work
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import VerticalScroll
from textual.widgets import Static

from console.errors import ConsoleError
from console.hosts.doctor_report import report_rows
from console.hosts.engine_client import doctor
from console.ui.host_text import cell, markup, plain
from console.ui.keymap import bindings
from console.ui.services import services


def report_view(report: dict[str, Any]) -> Group:
    """The doctor report as a label column and a value column: a long value (a path) wraps
    inside its own column, under the value above it, never back at the pane's edge."""
    head, rows = report_rows(report)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column(ratio=1, overflow="fold")
    for label, value in rows:
        grid.add_row(cell(label), cell(value))   # host text: never markup, ^X shown
    return Group(cell(head), grid)


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
            report_widget.update(report_view(report))
