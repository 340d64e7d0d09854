"""The hosts list: every configured host with its connection state."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.content import Content
from textual.widgets import Label, ListItem, ListView

from console.hosts.host import HostState
from console.ui.host_text import markup
from console.ui.messages import HostSelected

_MARK = {
    HostState.IDLE: "○",
    HostState.CONNECTING: "◌",
    HostState.CONNECTED: "●",
    HostState.RECONNECTING: "◌",
    HostState.FAILED: "✖",
}


def state_text(state: HostState) -> str:
    """`● connected`: a host's state as the list marks it (the header says the same)."""
    return f"{_MARK[state]} {state.value}"


class HostItem(ListItem):
    """One host row."""

    def __init__(self, host: str, note: str = "") -> None:
        super().__init__(id=f"host-{host}")
        self.host = host
        self.note = note    # a second line: "(this machine)" for a host without ssh
        self.label = Label(self._text(HostState.IDLE))

    def compose(self) -> ComposeResult:
        yield self.label

    def _text(self, state: HostState) -> Content:
        text = markup("$mark $host  [dim]$state[/]", mark=_MARK[state], host=self.host,
                      state=state.value)
        return text + (markup("\n  [dim]$note[/]", note=self.note) if self.note else "")

    def show(self, state: HostState) -> None:
        self.label.update(self._text(state))
        self.set_class(state is HostState.FAILED, "-failed")
        self.set_class(state is HostState.CONNECTED, "-connected")
        self.set_class(state in (HostState.RECONNECTING, HostState.CONNECTING), "-pending")


class HostList(ListView):
    """Hosts, selectable; posts HostSelected."""

    BORDER_TITLE = "Hosts"

    def __init__(self, hosts: list[str], notes: dict[str, str] | None = None,
                 **kw: object) -> None:
        notes = notes or {}
        super().__init__(*(HostItem(h, notes.get(h, "")) for h in hosts),
                         **kw)  # type: ignore[arg-type]

    def show_state(self, host: str, state: HostState) -> None:
        for item in self.query(HostItem):
            if item.host == host:
                item.show(state)

    def on_list_view_highlighted(self, event: ListView.Highlighted) -> None:
        if isinstance(event.item, HostItem):
            self.post_message(HostSelected(event.item.host))
