"""The Textual app: thin. Screens, panes and widgets live in their own packages."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from pathlib import PurePath
from typing import ClassVar

from textual.app import App
from textual.binding import BindingType
from textual.command import CommandPalette
from textual.content import Content
from textual.notifications import SeverityLevel
from textual.theme import Theme

from console.demo.config import add_demo
from console.dialogs.help import HelpScreen
from console.hosts.host import HostPool, HostState
from console.monitor.service import MonitorHub
from console.screens.main import MainScreen
from console.settings.config import Config
from console.text import terminal_text
from console.ui.keymap import bindings
from console.ui.messages import HostStateChanged
from console.ui.palette import ConsoleCommands
from console.ui.themes import (
    DEFAULT_THEME,
    OurThemes,
    check_theme,
    css_paths,
    register_themes,
    remember_theme,
)


class Eagle3App(App):
    """eagle3-console."""

    TITLE = "eagle3-console"
    CSS_PATH = list[str | PurePath](css_paths())
    COMMANDS = App.COMMANDS | {ConsoleCommands}   # every pane action by name (ctrl+p)
    BINDINGS: ClassVar[list[BindingType]] = list(bindings("main", on="Eagle3App"))  # q

    def __init__(self, config: Config, host: str | None = None, *,
                 clock: Callable[[], float] = time.time,
                 monitors: MonitorHub | None = None) -> None:
        super().__init__()
        self.config = config
        self.clock = clock  # every pane takes "now" from here (tests freeze it)
        self.pool = HostPool(config, on_state=self._on_host_state, clock=clock)
        self.monitors = monitors or MonitorHub(self.pool, clock=clock)
        names = list(config.hosts)
        self.initial_host = host if host in config.hosts else names[0]
        self.theme_flag: str | None = None  # --theme: remembered once the app runs
        register_themes(self)
        # Each animation frame is a screen update: the tab underline's slide alone cost more
        # CPU than the switch it decorates. TEXTUAL_ANIMATIONS, when set, still decides.
        if "TEXTUAL_ANIMATIONS" not in os.environ:
            self.animation_level = "none"

    def on_mount(self) -> None:
        self.theme_changed_signal.subscribe(self, self._on_theme_changed)
        if self.theme_flag:
            self._on_theme_changed(self.current_theme)
        notes = {n: "(this machine)" for n, h in self.config.hosts.items() if h.is_local}
        self.push_screen(MainScreen(list(self.config.hosts), self.initial_host, notes))
        self.call_after_refresh(self._freeze_startup_objects)

    def action_help(self) -> None:
        """`?` on any screen: every key, by pane (console/ui/keymap.py)."""
        if not isinstance(self.screen, HelpScreen):
            from textual.widgets import TabbedContent
            tabs = self.screen.query(TabbedContent)
            active = tabs.first().active if tabs else ""
            self.push_screen(HelpScreen(first=active.removeprefix("tab-") or None))

    def search_themes(self) -> None:
        """The palette's "Theme" command: our themes, not Textual's twenty beside them."""
        self.push_screen(CommandPalette(providers=[OurThemes], placeholder="Search for themes…"))

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = True) -> None:
        """Every toast is text: what it quotes (a run id, a path, a host's error) came from a
        host, and read as markup it ended the app (`[/b]`) or ran an action when clicked. The
        `markup` flag a widget passes on is ignored; control characters show as ^X."""
        super().notify(terminal_text(message), title=terminal_text(title), severity=severity,
                       timeout=timeout, markup=False)

    def format_title(self, title: str, sub_title: str) -> Content:
        """The header: a screen's title is a run id or a host (control characters as ^X)."""
        return super().format_title(terminal_text(title), terminal_text(sub_title))

    def _freeze_startup_objects(self) -> None:
        """The widget tree, styles and modules live as long as the app: keep them out of the
        garbage collector's full passes, which would otherwise walk all of them again and again
        while log lines and samples stream in (undone on unmount)."""
        gc.collect()
        gc.freeze()

    def _on_host_state(self, host: str, state: HostState, detail: str) -> None:
        # services call back from workers on the app's loop; deliver to the screen as a message
        self.screen.post_message(HostStateChanged(host, state, detail))

    def _on_theme_changed(self, theme: Theme) -> None:
        if theme.name != self.config.theme:
            remember_theme(self.config, theme.name)

    async def on_unmount(self) -> None:
        gc.unfreeze()
        await self.monitors.close()
        await self.pool.close()


def create_app(config: Config, theme: str | None = None, host: str | None = None, *,
               clock: Callable[[], float] = time.time,
               monitors: MonitorHub | None = None) -> Eagle3App:
    """The app factory shared by the CLI and the tests (a built-in config gets the demo)."""
    add_demo(config)
    app = Eagle3App(config, host=host, clock=clock, monitors=monitors)
    where = "--theme" if theme else f"{config.path}: theme" if config.theme else "default"
    app.theme = check_theme(app, theme or config.theme or DEFAULT_THEME, where)
    app.theme_flag = theme
    return app


def run_app(config: Config, theme: str | None = None, host: str | None = None) -> int:
    create_app(config, theme=theme, host=host).run()
    return 0
