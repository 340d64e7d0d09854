"""The hosts list: every configured host with its connection state."""

from __future__ import annotations

from rich.cells import cell_len
from textual.app import ComposeResult
from textual.content import Content
from textual.widgets import Label, ListItem, ListView

from console.hosts.host import HostState, HostView
from console.ui.host_text import markup
from console.ui.messages import HostSelected
from console.widgets.meters import fmt_span

_MARK = {
    HostState.IDLE: "○",
    HostState.CONNECTING: "◌",
    HostState.CONNECTED: "●",
    HostState.RECONNECTING: "◌",
    HostState.FAILED: "✖",
}


#: what to do about an unknown host key (console/screens/main.py's K, the palette's command)
TRUST_HINT = "K (or ctrl+p: Trust host key) shows it and trusts it once you say yes"


def state_word(view: HostView) -> str:
    """`connected`, `no answer for 50 s`, `failed, no answer for 2 min`: the state, or how long
    a host that answered before has been silent (whatever the link underneath is doing)."""
    if view.unknown_key is not None:
        return "unknown host key"
    if view.silent_s is None:
        return view.state.value
    silent = f"no answer for {fmt_span(view.silent_s)}"
    return f"failed, {silent}" if view.state is HostState.FAILED else silent


def mark(view: HostView) -> str:
    return "◌" if view.silent_s is not None and view.state is not HostState.FAILED \
        else _MARK[view.state]


def state_text(view: HostView) -> str:
    """`● connected`: a host's state as the list marks it (the header and the GPU pane say
    the same)."""
    return f"{mark(view)} {state_word(view)}"


#: columns inside the list (themes/base.tcss: 24 wide, less its border)
ROOM = 22


def state_lines(word: str, room: int) -> list[str]:
    """The state in lines of `room` columns, broken after its commas."""
    lines: list[str] = []
    for part in word.split(", "):
        if lines and len(lines[-1]) + 2 + len(part) <= room:
            lines[-1] += ", " + part
        else:
            if lines:
                lines[-1] += ","
            lines.append(part)
    return lines


class HostItem(ListItem):
    """One host row."""

    def __init__(self, host: str, note: str = "") -> None:
        super().__init__(id=f"host-{host}")
        self.host = host
        self.note = note    # a second line: "(this machine)" for a host without ssh
        self.label = Label(self._text(HostView(HostState.IDLE, None, "")))
        self.shown: HostView | None = None

    def compose(self) -> ComposeResult:
        yield self.label

    def _text(self, view: HostView) -> Content:
        """`● gpu1  connected` on one line where it fits the list; else `✖ gpu2` and its state
        under it, a line per part that fits (`failed,` / `no answer for 2 min`); then its
        note."""
        word = state_word(view)
        if cell_len(f"{mark(view)} {self.host}  {word}") <= ROOM:
            text = markup("$mark $host  [dim]$state[/]", mark=mark(view), host=self.host,
                          state=word)
        else:
            text = markup("$mark $host", mark=mark(view), host=self.host)
            for line in state_lines(word, ROOM - 2):
                text += markup("\n  [dim]$line[/]", line=line)
        return text + (markup("\n  [dim]$note[/]", note=self.note) if self.note else "")

    def show(self, view: HostView) -> None:
        if view == self.shown:
            return
        self.shown = view
        state, silent = view.state, view.silent_s is not None
        self.label.update(self._text(view))
        self.set_class(state is HostState.FAILED, "-failed")
        self.set_class(state is HostState.CONNECTED and not silent, "-connected")
        self.set_class(state in (HostState.RECONNECTING, HostState.CONNECTING)
                       or (silent and state is not HostState.FAILED), "-pending")


class HostList(ListView):
    """Hosts, selectable; posts HostSelected."""

    BORDER_TITLE = "Hosts"

    def __init__(self, hosts: list[str], notes: dict[str, str] | None = None,
                 **kw: object) -> None:
        notes = notes or {}
        super().__init__(*(HostItem(h, notes.get(h, "")) for h in hosts),
                         **kw)  # type: ignore[arg-type]

    def show_state(self, host: str, view: HostView) -> None:
        for item in self.query(HostItem):
            if item.host == host:
                item.show(view)

    def on_list_view_highlighted(self, event: ListView.Highlighted) -> None:
        if isinstance(event.item, HostItem):
            self.post_message(HostSelected(event.item.host))
