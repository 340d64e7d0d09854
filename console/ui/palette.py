"""The command palette's console commands (ctrl+p): every pane action and pane, by name.

Built from the key map (console/ui/keymap.py) that the bindings, the footer and help also read:
"Runs: Launch" switches to the runs tab and runs the pane's `launch` action, exactly as pressing
`t` there would. The app sets this provider once (App.COMMANDS), beside Textual's own commands
(themes, quit, screenshot, ...). It imports no screen: it runs actions by name.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.screen import Screen

from console.ui.keymap import KEYS, PANES, SECTIONS, Key, key_display
from console.ui.services import services

Command = tuple[str, str, Callable[[], object]]


def screen_section(screen: Screen) -> str | None:
    """The key map section of a screen (its KEY_SECTION), None for Textual's own."""
    return getattr(screen, "KEY_SECTION", None)


class ConsoleCommands(Provider):
    """Pane actions of the main screen, and the keys of whatever screen is on top."""

    def commands(self) -> list[Command]:
        screen = self.screen
        section = screen_section(screen)
        out: list[Command] = []
        if section == "main":
            show = screen.action_show_pane  # type: ignore[attr-defined]
            for n, (tab_id, title) in enumerate(PANES, start=1):
                out.append((f"Show {title}", f"switch to the {title} pane (key {n})",
                            partial(show, tab_id)))
                for k in _palette_keys(tab_id):
                    out.append((f"{title}: {k.label}", f"{k.text} (key {_key(k)})",
                                partial(self._pane_action, screen, tab_id, k)))
            for k in _palette_keys("main"):   # the screen's own (trust the host's key)
                out.append((k.label, f"{k.text} (key {_key(k)})",
                            partial(screen.run_action, k.action)))
        elif section is not None:
            where = SECTIONS[section]
            for k in _palette_keys(section):
                out.append((k.label, f"{k.text} ({where}, key {_key(k)})",
                            partial(screen.run_action, k.action)))
        out.append(("Help: all keys", "every key, by pane (key ?)",
                    services(self).action_help))
        return out

    async def _pane_action(self, screen: Screen, tab_id: str, key: Key) -> None:
        screen.action_show_pane(tab_id)  # type: ignore[attr-defined]
        pane = screen.query_one(f"#pane-{tab_id}")
        target = pane.query_one(key.on) if key.on else pane   # a widget's key runs on it
        await target.run_action(key.action)

    async def discover(self) -> Hits:
        for name, help_text, callback in self.commands():
            yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text, callback in self.commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)


def _palette_keys(section: str) -> list[Key]:
    """A section's palette commands: bound keys, once per label."""
    seen: set[str] = set()
    out = []
    for k in KEYS:
        if k.section == section and k.bound and k.palette and k.label not in seen:
            seen.add(k.label)
            out.append(k)
    return out


def _key(k: Key) -> str:
    return key_display(k.keys)
