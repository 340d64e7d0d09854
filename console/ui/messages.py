"""Messages the console's widgets and services post, one small class each."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.message import Message

from console.hosts.host import HostState

if TYPE_CHECKING:
    from console.demo.build import DemoStatus
    from console.runs.pipeline import PipelineFeeds
    from console.runs.watch import RunFeed


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


class OpenRun(Message):
    """Show a run's detail screen (the runs pane asks; the main screen pushes the screen, so
    the pane need not import the screen)."""

    def __init__(self, feed: RunFeed, pipeline: PipelineFeeds | None = None) -> None:
        super().__init__()
        self.feed = feed
        self.pipeline = pipeline   # a pipeline's parts, when its row was opened


class DemoChanged(Message):
    """The embedded demo's build moved on (console/demo/build.py posts one per step)."""

    def __init__(self, status: DemoStatus) -> None:
        super().__init__()
        self.status = status
