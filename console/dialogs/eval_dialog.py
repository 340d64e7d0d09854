"""The evaluate dialog: measure the selected drafter's acceptance on the host (target, held-out
data, k, samples, through vLLM's engine or transformers).

The pane prefills the target as the serve dialog's verifier, and the held-out folder last used on
the host (else the demo's held-out set; never the training data, which reads high). Below 30
lines the fields are compact, so the buttons stay on an 80x24 terminal. A field that is missing
or not a number is named under the fields and the dialog stays open."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Static

from console.checkpoints.evaluate import EvalRequest
from console.dialogs.convert_dialog import SHORT, compact_fields
from console.errors import ConsoleError
from console.ui.host_text import markup, plain
from console.ui.keymap import bindings

VLLM_ENGINE = "through vLLM's engine (targets transformers cannot hold)"


class EvalDialog(ModalScreen["EvalRequest | None"]):
    """Dismisses with an EvalRequest, or None when cancelled."""

    KEY_SECTION: ClassVar[str] = "evaluate"   # its keys in console/ui/keymap.py
    BINDINGS: ClassVar[list[BindingType]] = list(bindings("evaluate"))
    VERTICAL_BREAKPOINTS = [(0, "-short"), (SHORT, "-tall")]   # themes/dialogs.tcss

    def __init__(self, ckpt: str, target: str = "", data: str = "") -> None:
        super().__init__()
        self.ckpt, self.target, self.data = ckpt, target, data

    def compose(self) -> ComposeResult:
        with Vertical(id="eval-box", classes="dialog"):
            yield Static(markup("Evaluate [b]$ckpt[/b]", ckpt=self.ckpt), id="eval-title")
            yield Label("Target [b]*[/b] (the target model folder on the host)")
            yield Input(self.target, placeholder="e.g. /models/Llama-3.1-8B-Instruct",
                        id="eval-target")
            yield Label("Held-out data [b]*[/b] (prepared samples it did not train on)")
            yield Input(self.data, placeholder="e.g. /data/heldout (a prepared data folder)",
                        id="eval-data")
            with Horizontal(id="eval-numbers"):
                yield Label("k ")
                yield Input("3", id="eval-k", type="integer")
                yield Label(" samples ")
                yield Input("64", id="eval-samples", type="integer")
            yield Checkbox(VLLM_ENGINE, id="eval-vllm")
            yield Static("", id="eval-error", classes="dialog-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Evaluate (ctrl+s)", id="eval-ok", variant="primary")
                yield Button("Cancel (esc)", id="eval-cancel")

    def on_resize(self) -> None:
        compact_fields(self, self.size.height < SHORT)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "eval-ok":
            self.action_evaluate()
        else:
            self.action_cancel()

    def _say(self, problem: str) -> None:
        self.query_one("#eval-error", Static).update(plain(problem))

    def action_evaluate(self) -> None:
        def text(wid: str) -> str:
            return self.query_one(f"#{wid}", Input).value.strip()
        try:
            k, samples = int(text("eval-k") or "x"), int(text("eval-samples") or "x")
        except ValueError:
            self._say("k and samples: enter whole numbers")
            return
        req = EvalRequest(self.ckpt, text("eval-target"), text("eval-data"), k=k,
                          max_samples=samples,
                          vllm_engine=self.query_one("#eval-vllm", Checkbox).value)
        try:
            req.args()   # the same checks the subcommand makes, named in the dialog
        except ConsoleError as e:
            self._say(str(e))
            return
        self.dismiss(req)

    def action_cancel(self) -> None:
        self.dismiss(None)
