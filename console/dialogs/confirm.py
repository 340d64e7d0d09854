"""A yes/no question in a modal dialog (stop a run, start a second copy of a profile)."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from console.ui.host_text import plain
from console.ui.keymap import bindings


class ConfirmScreen(ModalScreen[bool]):
    """Dismisses with True (y / the Yes button) or False (n / escape / No)."""

    KEY_SECTION: ClassVar[str] = "confirm"   # its keys in console/ui/keymap.py
    BINDINGS: ClassVar[list[BindingType]] = list(bindings("confirm"))

    def __init__(self, question: str | Content, yes: str = "Yes", no: str = "No") -> None:
        """question: text (shown as written), or Content made with console/ui/host_text.py's
        `markup` where a part is bold."""
        super().__init__()
        self.question = question if isinstance(question, Content) else plain(question)
        self.yes, self.no = yes, no

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box", classes="dialog"):
            yield Static(self.question, id="confirm-question")
            with Horizontal(classes="dialog-buttons"):
                yield Button(f"{self.yes} (y)", id="confirm-yes", variant="warning")
                yield Button(f"{self.no} (n)", id="confirm-no")

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
