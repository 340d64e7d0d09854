"""The convert dialog: target style, destination folder, verifier, dtype, replace-if-it-exists.

The verifier (the target model) is required by the speculators style, which records it, and
optional for the others; the pane prefills it from the checkpoint's own config or the targets
the host's profiles train against."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Select, Static

from console.checkpoints.service import DTYPES, STYLES
from console.ui.keymap import bindings

STYLE_HELP = {
    "eagle": "EAGLE / SpecForge style (midlayer.* keys)",
    "speculators": "speculators style (layers.0.* + speculators_config)",
    "vllm": "the EAGLE style vLLM loads (LlamaForCausalLMEagle3)",
    "sglang": "the EAGLE style SGLang loads (midlayer.* only)",
}


VERIFIER_REQUIRED = ("speculators",)   # styles whose config records the verifier
REPLACE = "replace if it exists"


def verifier_label(style: str) -> str:
    if style in VERIFIER_REQUIRED:
        return f"Verifier [b]*[/b] (required for {style}: the target model, recorded in config)"
    return f"Verifier (optional for {style}: the target model)"


def exists_message(dst: str) -> str:
    """What the pane says when the destination is there and replacing was not asked for."""
    return f"{dst} already exists: tick “{REPLACE}” in the dialog to replace it"


@dataclass(frozen=True)
class ConvertRequest:
    """What the user asked for."""

    src: str
    dst: str
    to: str
    dtype: str
    force: bool
    verifier: str | None = None


def default_destination(src: str, to: str, converted_dir: str) -> str:
    """ROOT/converted/<source name>-<style>, e.g. .../converted/final-vllm."""
    base = posixpath.basename(src.rstrip("/")) or "drafter"
    parent = posixpath.basename(posixpath.dirname(src.rstrip("/")))
    if base in ("final", "best") or base.startswith("step_"):   # a run output: say which run
        run = posixpath.basename(posixpath.dirname(posixpath.dirname(src.rstrip("/"))))
        base = f"{run or parent}-{base}" if parent == "out" else f"{parent}-{base}"
    return posixpath.join(converted_dir, f"{base}-{to}")


class ConvertDialog(ModalScreen["ConvertRequest | None"]):
    """Dismisses with a ConvertRequest, or None when cancelled."""

    KEY_SECTION: ClassVar[str] = "convert"   # its keys in console/ui/keymap.py
    BINDINGS: ClassVar[list[BindingType]] = list(bindings("convert"))

    def __init__(self, src: str, converted_dir: str, to: str = "vllm",
                 verifier: str = "") -> None:
        super().__init__()
        self.src = src
        self.converted_dir = converted_dir
        self.to = to
        self.verifier = verifier
        self._edited = False

    def compose(self) -> ComposeResult:
        with Vertical(id="convert-box", classes="dialog"):
            yield Static(f"Convert [b]{self.src}[/b]", id="convert-title")
            yield Label("Target style")
            yield Select([(f"{s}: {STYLE_HELP[s]}", s) for s in STYLES], value=self.to,
                         allow_blank=False, id="convert-to")
            yield Label("Destination")
            yield Input(default_destination(self.src, self.to, self.converted_dir),
                        id="convert-dst")
            yield Label(verifier_label(self.to), id="convert-verifier-label")
            yield Input(self.verifier, placeholder="hub name or folder on the host, e.g. "
                        "/models/Llama-3.1-8B-Instruct", id="convert-verifier")
            with Horizontal(id="convert-options"):
                yield Label("dtype ")
                yield Select([(d, d) for d in DTYPES], value="keep", allow_blank=False,
                             id="convert-dtype")
                yield Checkbox(REPLACE, id="convert-force")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Convert (ctrl+s)", id="convert-ok", variant="primary")
                yield Button("Cancel (esc)", id="convert-cancel")

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "convert-dst":
            self._edited = event.value != default_destination(self.src, self.to,
                                                              self.converted_dir)

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id == "convert-to" and isinstance(event.value, str):
            self.to = event.value
            self.query_one("#convert-verifier-label", Label).update(verifier_label(self.to))
            if not self._edited:  # follow the style until the user typed a path of their own
                self.query_one("#convert-dst", Input).value = default_destination(
                    self.src, self.to, self.converted_dir)
                self._edited = False

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "convert-ok":
            self.action_convert()
        else:
            self.action_cancel()

    def action_convert(self) -> None:
        dst = self.query_one("#convert-dst", Input).value.strip()
        if not dst:
            self.notify("Destination: enter a folder path", severity="error")
            return
        dtype = self.query_one("#convert-dtype", Select).value
        verifier = self.query_one("#convert-verifier", Input).value.strip() or None
        if verifier is None and self.to in VERIFIER_REQUIRED:
            self.notify(f"Verifier: required for the {self.to} style (the target model, a hub "
                        "name or a folder on the host)", severity="error")
            self.query_one("#convert-verifier", Input).focus()
            return
        self.dismiss(ConvertRequest(self.src, dst, self.to, str(dtype),
                                    self.query_one("#convert-force", Checkbox).value, verifier))

    def action_cancel(self) -> None:
        self.dismiss(None)
