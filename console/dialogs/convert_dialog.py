"""The convert dialog: target style, destination folder, verifier, dtype, replace-if-it-exists.

The verifier (the target model) is required by the speculators style, which records it, and
optional for the others; the pane prefills it from the checkpoint's own config or the targets
the host's profiles train against. A destination the pane or the engine refuses (it exists, or
is not a drafter folder that may be replaced) reopens the dialog as it was, with the reason
under the destination field. Below 30 lines (80x24) the fields are drawn compact (one line
each), so the buttons stay on screen."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Select, Static

from console.checkpoints.service import DTYPES, STYLES
from console.ui.host_text import markup, plain
from console.ui.keymap import bindings

STYLE_HELP = {
    "eagle": "EAGLE / SpecForge style (midlayer.* keys)",
    "speculators": "speculators style (layers.0.* + speculators_config)",
    "vllm": "the EAGLE style vLLM loads (LlamaForCausalLMEagle3)",
    "sglang": "the EAGLE style SGLang loads (midlayer.* only)",
}


VERIFIER_REQUIRED = ("speculators",)   # styles whose config records the verifier
REPLACE = "replace if it exists"


SHORT = 30   # below this many lines the dialog's fields are compact


def verifier_label(style: str) -> Content:
    if style in VERIFIER_REQUIRED:
        return markup("Verifier [b]*[/b] (required for $style: the target model)", style=style)
    return plain(f"Verifier (optional for {style}: the target model)")


def compact_fields(screen: ModalScreen[Any], compact: bool) -> None:
    """One line per field (no borders) on a short terminal, so a dialog's buttons stay on it."""
    for w in screen.query("Input, Select, Checkbox, Button"):
        w.compact = compact  # type: ignore[attr-defined]


def exists_message() -> str:
    """Under the destination field when it exists and replacing was not asked for."""
    return (f"already exists: tick “{REPLACE}” to replace a drafter folder there, or choose "
            "another destination")


def dialog_words(message: str, dst: str) -> str:
    """The engine's refusal of a destination, said in the dialog's words: without the path
    (the field shows it) and with the checkbox where the engine names --force."""
    for prefix in (dst.rstrip("/") + ": ", dst + ": "):
        message = message.split(prefix, 1)[1] if prefix in message else message
    return (message.replace("--force", f"“{REPLACE}”").replace("another DST", "another "
                                                                 "destination"))


@dataclass(frozen=True)
class ConvertRequest:
    """What the user asked for."""

    src: str
    dst: str
    to: str
    dtype: str
    force: bool
    verifier: str | None = None


STEP_DIR = re.compile(r"step_\d{6,}")
STYLE_SUFFIX = re.compile(r"(?:-(?:" + "|".join(STYLES) + r"))+$")


def default_destination(src: str, to: str, converted_dir: str, step: int | None = None) -> str:
    """ROOT/converted/<run>-<which>-<style>: a run's output is named by its run and step
    (`ft-1-step_000150-vllm`, `ft-1-best-step_000120-vllm` when the drafter's provenance gives
    `step`, `ft-1-final-vllm` otherwise); any other drafter by its folder name, less the style
    suffix an earlier conversion gave it, so a re-convert names one style, not a chain."""
    parts = [p for p in src.split("/") if p]
    name = parts[-1] if parts else "drafter"
    if name in ("final", "best") or STEP_DIR.fullmatch(name):
        i = len(parts) - 2
        while i >= 0 and parts[i] in ("out", "checkpoints"):   # RUN/out/checkpoints/step_N
            i -= 1
        which = name if step is None or STEP_DIR.fullmatch(name) else f"{name}-step_{step:06d}"
        name = f"{parts[i]}-{which}" if i >= 0 else which
    else:
        name = STYLE_SUFFIX.sub("", name) or name
    return posixpath.join(converted_dir, f"{name}-{to}")


class ConvertDialog(ModalScreen["ConvertRequest | None"]):
    """Dismisses with a ConvertRequest, or None when cancelled. `request` and `error` reopen it
    as the user left it, with the reason the destination was refused."""

    KEY_SECTION: ClassVar[str] = "convert"   # its keys in console/ui/keymap.py
    BINDINGS: ClassVar[list[BindingType]] = list(bindings("convert"))
    VERTICAL_BREAKPOINTS = [(0, "-short"), (SHORT, "-tall")]   # themes/dialogs.tcss

    def __init__(self, src: str, converted_dir: str, to: str = "vllm",
                 verifier: str = "", step: int | None = None,
                 request: ConvertRequest | None = None, error: str | None = None) -> None:
        super().__init__()
        self.src = src
        self.converted_dir = converted_dir
        self.step = step
        self.request = request
        self.error = error
        self.to = request.to if request else to
        self.verifier = (request.verifier or "") if request else verifier
        self._edited = bool(request and request.dst != self._default())

    def _default(self) -> str:
        return default_destination(self.src, self.to, self.converted_dir, self.step)

    def compose(self) -> ComposeResult:
        req = self.request
        with Vertical(id="convert-box", classes="dialog"):
            yield Static(markup("Convert [b]$src[/b]", src=self.src), id="convert-title")
            yield Label("Target style")
            yield Select([(f"{s}: {STYLE_HELP[s]}", s) for s in STYLES], value=self.to,
                         allow_blank=False, id="convert-to")
            yield Label("Destination")
            yield Input(req.dst if req else self._default(), id="convert-dst")
            error = Static(plain(f"✖ {self.error}" if self.error else ""), id="convert-dst-error",
                           classes="dialog-error")
            error.display = bool(self.error)
            yield error
            yield Label(verifier_label(self.to), id="convert-verifier-label")
            yield Input(self.verifier, placeholder="hub name or folder on the host, e.g. "
                        "/models/Llama-3.1-8B-Instruct", id="convert-verifier")
            with Horizontal(id="convert-options"):
                yield Label("dtype ")
                yield Select([(d, d) for d in DTYPES], value=req.dtype if req else "keep",
                             allow_blank=False, id="convert-dtype")
                yield Checkbox(REPLACE, bool(req and req.force), id="convert-force")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Convert (ctrl+s)", id="convert-ok", variant="primary")
                yield Button("Cancel (esc)", id="convert-cancel")

    def on_mount(self) -> None:
        if self.error:   # back for a refused destination: the field to change has the cursor
            self.query_one("#convert-dst", Input).focus()

    def on_resize(self) -> None:
        compact_fields(self, self.size.height < SHORT)

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "convert-dst":
            self._edited = event.value != self._default()

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id == "convert-to" and isinstance(event.value, str):
            self.to = event.value
            self.query_one("#convert-verifier-label", Label).update(verifier_label(self.to))
            if not self._edited:  # follow the style until the user typed a path of their own
                self.query_one("#convert-dst", Input).value = self._default()
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
