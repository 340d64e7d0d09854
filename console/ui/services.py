"""What panes and screens use of the app, typed: its config, host pool, monitors and clock.

Textual types `widget.app` as its base `App`; `services(widget)` gives the same object as the
`AppServices` protocol, so a pane's use of them is type-checked instead of silenced. Tests that
mount a pane in another app provide these attributes too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

if TYPE_CHECKING:   # types only: the app imports the panes, which import this module
    from console.hosts.host import HostPool
    from console.monitor.service import MonitorHub
    from console.settings.config import Config


class AppServices(Protocol):
    config: Config
    pool: HostPool
    monitors: MonitorHub
    clock: Callable[[], float]   # "now" for every pane (tests freeze it)

    def action_help(self) -> None: ...


class InApp(Protocol):
    """A widget, screen or command provider: anything that knows its app."""

    @property
    def app(self) -> object: ...


def services(node: InApp) -> AppServices:
    """The app `node` belongs to, as the services it provides."""
    return cast("AppServices", node.app)
