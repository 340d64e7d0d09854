"""The command palette's console commands (ctrl+p): every pane action and pane, by name.

Built from the same BINDINGS the footer and the help screen show: "Runs: Launch" switches to
the runs tab and runs the pane's `launch` action, exactly as pressing `t` there would. Textual's
own commands (themes, quit, screenshot, ...) stay in the palette beside these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.widget import Widget


def _bindings(cls: type) -> Iterator[tuple[str, str]]:
    """(action, description) of a class's described bindings, once per action."""
    from console.screens.help import own_bindings
    seen = set()
    for b in own_bindings(cls):
        action, desc = (b.action, b.description) if isinstance(b, Binding) else \
            (b[1], b[2] if len(b) > 2 else "")
        if desc and action not in seen:
            seen.add(action)
            yield action, desc


class ConsoleCommands(Provider):
    """Pane actions of the main screen, and the keys of whatever screen is on top."""

    def commands(self) -> list[tuple[str, str, Callable[[], object]]]:
        from console.screens.main import PANES, MainScreen
        screen = self.screen
        out: list[tuple[str, str, Callable[[], object]]] = []
        if isinstance(screen, MainScreen):
            for n, (tab_id, title, cls) in enumerate(PANES, start=1):
                out.append((f"Show {title}", f"switch to the {title} pane (key {n})",
                            partial(screen.action_show_pane, tab_id)))
                for action, desc in _bindings(cls):
                    out.append((f"{title}: {desc}", f"{desc} in the {title} pane",
                                partial(self._pane_action, screen, tab_id, action)))
        for action, desc in _bindings(type(screen)):
            if action.startswith("show_pane") or action == "app.quit":
                continue
            out.append((desc, f"{desc} ({type(screen).__name__})",
                        partial(screen.run_action, action)))
        out.append(("Help: all keys", "every binding, by pane (key ?)",
                    partial(self._help)))
        return out

    def _help(self) -> None:
        from console.screens.help import HelpScreen
        self.app.push_screen(HelpScreen())

    async def _pane_action(self, screen: object, tab_id: str, action: str) -> None:
        screen.action_show_pane(tab_id)  # type: ignore[attr-defined]
        pane: Widget = screen.query_one(f"#pane-{tab_id}")  # type: ignore[attr-defined]
        await pane.run_action(action)

    async def discover(self) -> Hits:
        for name, help_text, callback in self.commands():
            yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text, callback in self.commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)
