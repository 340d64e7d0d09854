"""The Textual app: thin. Screens, panes and widgets live in their own packages."""

from __future__ import annotations

from pathlib import Path

from textual.app import App

from console.config import Config
from console.host import HostPool, HostState
from console.messages import HostStateChanged
from console.screens.main import MainScreen

THEMES_DIR = Path(__file__).resolve().parent.parent / "themes"


class Eagle3App(App):
    """eagle3-console."""

    TITLE = "eagle3-console"
    CSS_PATH = [THEMES_DIR / "base.tcss"]

    def __init__(self, config: Config, host: str | None = None) -> None:
        super().__init__()
        self.config = config
        self.pool = HostPool(config, on_state=self._on_host_state)
        names = list(config.hosts)
        self.initial_host = host if host in config.hosts else names[0]

    def on_mount(self) -> None:
        self.push_screen(MainScreen(list(self.config.hosts), self.initial_host))

    def _on_host_state(self, host: str, state: HostState, detail: str) -> None:
        # services call back from workers on the app's loop; deliver to the screen as a message
        self.screen.post_message(HostStateChanged(host, state, detail))

    async def on_unmount(self) -> None:
        await self.pool.close()


def create_app(config: Config, theme: str | None = None, host: str | None = None) -> Eagle3App:
    """The app factory shared by the CLI and the tests."""
    app = Eagle3App(config, host=host)
    if theme:
        app.theme = theme
    return app


def run_app(config: Config, theme: str | None = None, host: str | None = None) -> int:
    create_app(config, theme=theme, host=host).run()
    return 0
