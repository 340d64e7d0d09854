"""The main screen: hosts on the left, the panes of the selected host as tabs, key footer."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer, Header, TabbedContent, TabPane

from console.messages import HostSelected, HostStateChanged
from console.panes.overview import OverviewPane
from console.widgets.host_list import HostList

# (tab id, title, pane class). Each pane has show_host(name).
PANES: list[tuple[str, str, type]] = [
    ("overview", "Host", OverviewPane),
]


class MainScreen(Screen):
    """Hosts list + tabbed panes."""

    BINDINGS = [("q", "app.quit", "Quit")]

    def __init__(self, hosts: list[str], selected: str) -> None:
        super().__init__()
        self.host_names = hosts
        self.selected = selected

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="body"):
            yield HostList(self.host_names, id="hosts")
            with TabbedContent(id="panes"):
                for tab_id, title, cls in PANES:
                    with TabPane(title, id=f"tab-{tab_id}"):
                        yield cls(id=f"pane-{tab_id}")
        yield Footer()

    def on_mount(self) -> None:
        hosts = self.query_one(HostList)
        hosts.index = self.host_names.index(self.selected)
        self._select(self.selected)

    def on_host_selected(self, message: HostSelected) -> None:
        if message.host != self.selected:
            self._select(message.host)

    def on_host_state_changed(self, message: HostStateChanged) -> None:
        self.query_one(HostList).show_state(message.host, message.state)

    def _select(self, host: str) -> None:
        self.selected = host
        self.sub_title = host
        for tab_id, _title, _cls in PANES:
            self.query_one(f"#pane-{tab_id}").show_host(host)  # type: ignore[attr-defined]
