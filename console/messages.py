"""Messages the console's widgets and services post, one small class each."""

from __future__ import annotations

from textual.message import Message

from console.host import HostState


class HostSelected(Message):
    """The user picked another host in the hosts list."""

    def __init__(self, host: str) -> None:
        super().__init__()
        self.host = host


class HostStateChanged(Message):
    """A host's connection state changed (connecting, connected, reconnecting, failed)."""

    def __init__(self, host: str, state: HostState, detail: str) -> None:
        super().__init__()
        self.host, self.state, self.detail = host, state, detail
