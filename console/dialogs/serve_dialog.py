"""The serve dialog: serve the selected drafter in vLLM (verifier, TP size, k, port, extra args).

The pane prefills the verifier as the convert dialog does (the drafter's config, the one last
given on the host, the target its profiles train against). Below 30 lines the fields are
compact, so the buttons stay on an 80x24 terminal. What ctrl+s cannot take (no verifier, a TP
that is not a number) is said in the dialog, above its buttons, and the field gets the cursor
(a toast alone was missed: ctrl+s seemed to do nothing)."""

from __future__ import annotations

import shlex
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from console.checkpoints.serve import ServeRequest
from console.dialogs.convert_dialog import SHORT, compact_fields
from console.ui.host_text import markup, plain
from console.ui.keymap import bindings


class ServeDialog(ModalScreen["ServeRequest | None"]):
    """Dismisses with a ServeRequest, or None when cancelled."""

    KEY_SECTION: ClassVar[str] = "serve"   # its keys in console/ui/keymap.py
    BINDINGS: ClassVar[list[BindingType]] = list(bindings("serve"))
    VERTICAL_BREAKPOINTS = [(0, "-short"), (SHORT, "-tall")]   # themes/dialogs.tcss

    def __init__(self, ckpt: str, verifier: str = "") -> None:
        super().__init__()
        self.ckpt = ckpt
        self.verifier = verifier

    def compose(self) -> ComposeResult:
        with Vertical(id="serve-box", classes="dialog"):
            yield Static(markup("Serve [b]$ckpt[/b] in vLLM", ckpt=self.ckpt), id="serve-title")
            yield Label("Verifier [b]*[/b] (the target model: hub name or folder on the host)")
            yield Input(self.verifier, placeholder="e.g. /models/Llama-3.1-8B-Instruct",
                        id="serve-verifier")
            with Horizontal(id="serve-numbers"):
                yield Label("TP ")
                yield Input("1", id="serve-tp", type="integer")
                yield Label(" k ")
                yield Input("3", id="serve-k", type="integer")
                yield Label(" port ")
                yield Input("8000", id="serve-port", type="integer")
            yield Label("Extra `vllm serve` arguments")
            yield Input("", placeholder="e.g. --max-model-len 8192", id="serve-extra")
            error = Static("", id="serve-error", classes="dialog-error")
            error.display = False
            yield error
            with Horizontal(classes="dialog-buttons"):
                yield Button("Serve (ctrl+s)", id="serve-ok", variant="primary")
                yield Button("Cancel (esc)", id="serve-cancel")

    def on_resize(self) -> None:
        compact_fields(self, self.size.height < SHORT)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "serve-ok":
            self.action_serve()
        else:
            self.action_cancel()

    def refuse(self, wid: str, why: str) -> None:
        """Say why in the dialog and put the cursor in the field to change."""
        error = self.query_one("#serve-error", Static)
        error.update(plain(f"✖ {why}"))
        error.display = True
        self.query_one(f"#{wid}", Input).focus()

    def _int(self, wid: str, name: str) -> int | None:
        text = self.query_one(f"#{wid}", Input).value.strip()
        try:
            return int(text)
        except ValueError:
            self.refuse(wid, f"{name}: enter a whole number")
            return None

    def action_serve(self) -> None:
        verifier = self.query_one("#serve-verifier", Input).value.strip()
        if not verifier:
            self.refuse("serve-verifier", "Verifier: enter the target model (a hub name or a "
                        "folder on the host)")
            return
        tp = self._int("serve-tp", "TP")
        k = self._int("serve-k", "k") if tp is not None else None
        port = self._int("serve-port", "port") if k is not None else None
        if tp is None or k is None or port is None:
            return
        try:
            extra = shlex.split(self.query_one("#serve-extra", Input).value)
        except ValueError as e:
            self.refuse("serve-extra", f"Extra arguments: {e}")
            return
        self.dismiss(ServeRequest(self.ckpt, verifier, tp=tp, k=k, port=port, extra=extra))

    def action_cancel(self) -> None:
        self.dismiss(None)
