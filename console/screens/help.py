"""Help (`?`): every key, by pane, read from the classes' own BINDINGS so it cannot go stale.

Sections: keys that work everywhere on the main screen (its BINDINGS and the app's), then one
per pane in tab order (the pane's BINDINGS and those of the widgets inside it that add keys),
then the run detail screen and the dialogs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

Section = tuple[str, list[tuple[str, str]]]


def _keys(bindings: Iterable[BindingType]) -> list[tuple[str, str]]:
    """(key, description) of every binding that has a description."""
    out = []
    for b in bindings:
        if isinstance(b, Binding):
            key, desc = b.key_display or b.key, b.description
        else:
            key, desc = b[0], (b[2] if len(b) > 2 else "")
        if desc:
            out.append((_pretty(key), desc))
    return out


def _pretty(key: str) -> str:
    names = {"question_mark": "?", "escape": "esc", "slash": "/"}
    return ",".join(names.get(k.strip(), k.strip()) for k in key.split(","))


def own_bindings(cls: type) -> list[BindingType]:
    """The bindings our classes declare (Textual's inherited scrolling keys left out)."""
    out: list[BindingType] = []
    for klass in reversed(cls.__mro__):
        if klass.__module__.startswith("console.") or klass is cls:
            out += list(klass.__dict__.get("BINDINGS", []))
    return out


def _class_keys(cls: type) -> list[tuple[str, str]]:
    return _keys(own_bindings(cls))


def sections() -> list[Section]:
    """Every binding of the console, grouped as the module docstring says."""
    from console.screens.confirm import ConfirmScreen
    from console.screens.convert_dialog import ConvertDialog
    from console.screens.main import PANES, MainScreen
    from console.screens.run_detail import RunDetailScreen

    everywhere = [(k, d) for k, d in _class_keys(MainScreen) if not k.isdigit()]
    # the number keys are hidden bindings: list them once, with the tab they open
    tabs = ", ".join(f"{n} {title}" for n, (_id, title, _cls) in enumerate(PANES, start=1))
    everywhere.append(("1-9", f"show a pane: {tabs}"))
    everywhere += [("ctrl+p", "command palette (every action, by name)"),
                   ("tab", "next widget"), ("ctrl+q", "quit")]
    out: list[Section] = [("Everywhere", everywhere)]
    for _id, title, cls in PANES:
        keys = _class_keys(cls)
        for child in getattr(cls, "HELP_WIDGETS", ()):
            keys += [k for k in _class_keys(child) if k not in keys]
        out.append((f"{title} pane", keys or [("", "no keys of its own")]))
    out.append(("Run detail (enter on a run)", _class_keys(RunDetailScreen)))
    out.append(("Convert dialog (c on a checkpoint)", _class_keys(ConvertDialog)))
    out.append(("Questions", _class_keys(ConfirmScreen)))
    return out


def render_sections(secs: list[Section]) -> str:
    lines: list[str] = []
    for title, keys in secs:
        if lines:
            lines.append("")
        lines.append(f"[b]{title}[/b]")
        width = max((len(k) for k, _ in keys), default=0)
        lines += [f"  [b]{k.ljust(width)}[/b]  {d}" for k, d in keys]
    return "\n".join(lines)


class HelpScreen(ModalScreen[None]):
    """Every binding by pane; any of esc, q or ? closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "close", "Close"),
    ]

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box", classes="dialog"):
            yield Static("[b]eagle3-console keys[/b]", id="help-title")
            with VerticalScroll(id="help-scroll"):
                yield Static(render_sections(sections()), id="help-text")

    def action_close(self) -> None:
        self.dismiss(None)


def flat(secs: list[Section]) -> list[tuple[str, str, str]]:
    """(section, key, description) rows: what tests compare against the classes."""
    return [(t, k, d) for t, keys in secs for k, d in keys]
