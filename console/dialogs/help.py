"""Help (`?`): every key, by pane, read from the key map (console/ui/keymap.py).

Sections in the key map's order: keys that work everywhere on the main screen (the pane number
keys folded into one `1-6` row, and how to switch hosts), then the pane on screen, then the
other panes in tab order (keys its widgets hold included: the log view's arrows are under Logs),
then the run detail screen and the dialogs. Keys with the same label in one section share a row
(`enter i  Inspect`); a key bound twice in a section (the Runs pane's `enter` and its tables')
has one row, the first binding's.
"""

from __future__ import annotations

from typing import ClassVar

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from console.ui.keymap import KEYS, PANES, SECTIONS, bindings, key_display

Section = tuple[str, list[tuple[str, str]]]


def sections(first: str | None = None) -> list[Section]:
    """Every key of the console, grouped as the module docstring says; the section `first` (the
    pane on screen when `?` was pressed) right after "Everywhere", so its keys show without
    scrolling."""
    out: list[Section] = []
    order = list(SECTIONS)
    if first in SECTIONS and first != order[0]:
        order.remove(first)
        order.insert(1, first)
    for sid in order:
        title = SECTIONS[sid]
        rows: list[tuple[str, str]] = []
        labels: dict[str, int] = {}     # label -> its row, for keys that share one
        listed: set[str] = set()        # a key bound twice (a pane's and its table's enter)
        for k in (k for k in KEYS if k.section == sid):
            if k.keys.isdigit():
                if k.keys == "1":
                    tabs = ", ".join(f"{n} {t}" for n, (_i, t) in enumerate(PANES, start=1))
                    rows.append((f"1-{len(PANES)}", f"show a pane: {tabs}"))
                continue
            key = key_display(k.keys)
            if key in listed:           # one row per key: the first says what it does
                continue
            listed.add(key)
            if k.label in labels:
                row = labels[k.label]
                if key not in rows[row][0].split():
                    rows[row] = (f"{rows[row][0]} {key}", rows[row][1])
                continue
            labels[k.label] = len(rows)
            rows.append((key, k.text))
        out.append((title, rows or [("", "no keys of its own")]))
    return out


def render_sections(secs: list[Section]) -> Group:
    """Each section: its title, then a two-column grid of keys and what they do. A long
    description wraps inside its own column (a hanging indent), never under the keys, so the
    titles stay the only lines at the left edge however narrow the screen."""
    parts: list[Text | Table] = []
    for title, keys in secs:
        if parts:
            parts.append(Text(""))
        parts.append(Text(title, style="bold"))
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True, style="bold")
        grid.add_column(ratio=1)
        for k, d in keys:
            grid.add_row(f"  {k}", d)
        parts.append(grid)
    return Group(*parts)


class HelpScreen(ModalScreen[None]):
    """Every key by pane; esc or ? closes it (q quits, as everywhere)."""

    KEY_SECTION: ClassVar[str] = "help"   # its keys in console/ui/keymap.py
    BINDINGS: ClassVar[list[BindingType]] = list(bindings("help"))

    def __init__(self, first: str | None = None) -> None:
        super().__init__()
        self.first = first  # the pane whose keys come first (the one on screen)

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box", classes="dialog"):
            yield Static("[b]eagle3-console keys[/b]", id="help-title")
            with VerticalScroll(id="help-scroll"):
                yield Static(render_sections(sections(self.first)), id="help-text")

    def action_close(self) -> None:
        self.dismiss(None)


def flat(secs: list[Section]) -> list[tuple[str, str, str]]:
    """(section, key, description) rows: what tests compare against the key map."""
    return [(t, k, d) for t, keys in secs for k, d in keys]
