"""A checkpoint's inspect report (engine/commands/inspect.py's JSON) drawn for the pane: the
verdict and format first, then the provenance (run, step and held-out tau, finetune source,
data and vocab hashes: what tells out/best from out/final), the checks (PASS / FAIL in the
theme's success / error colours), config summary and the tensor table. An engine error is
shown whole, in the error colour."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual.widget import Widget

from console.checkpoints.results import ConfigSummary, InspectReport
from console.text import terminal_text
from console.widgets.meters import fmt_bytes


def config_lines(c: ConfigSummary) -> list[str]:
    return [f"H {c.hidden_size}  Ht {c.target_hidden_size}  I {c.intermediate_size}  heads "
            f"{c.num_attention_heads}/{c.num_key_value_heads}  head_dim {c.head_dim}",
            f"V {c.vocab_size}  Vd {c.draft_vocab_size}  aux layers {c.aux_layers}  rope "
            f"{c.rope_type} θ {c.rope_theta}  dtype {c.torch_dtype}"]


class InspectView(Widget):
    """Render-only: show_report / show_error / show_text replace what is drawn."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "inspect--pass", "inspect--fail", "inspect--label", "inspect--header", "inspect--error"}
    DEFAULT_CSS = "InspectView { height: auto; }"

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.report: InspectReport | None = None
        self.heading = ""
        self.error: str | None = None
        self.message = "Select a checkpoint to inspect it."
        self.root = ""   # the host's root: provenance paths under it are shown relative to it

    @property
    def plain(self) -> str:
        return self.render().plain

    def show_report(self, report: InspectReport, heading: str = "") -> None:
        self.report, self.heading, self.error = report, heading, None
        self.refresh(layout=True)

    def show_error(self, message: str, heading: str = "") -> None:
        self.report, self.heading, self.error = None, heading, message
        self.refresh(layout=True)

    def show_text(self, message: str) -> None:
        self.report, self.heading, self.error, self.message = None, "", None, message
        self.refresh(layout=True)

    def _s(self, name: str) -> Any:
        return self.get_component_rich_style(f"inspect--{name}", partial=True)

    def render(self) -> Text:
        out = Text()
        if self.heading:
            out.append(terminal_text(self.heading) + "\n", self._s("header"))
        if self.error is not None:
            out.append("✖ " + terminal_text(self.error), self._s("error"))
            return out
        r = self.report
        if r is None:
            out.append(terminal_text(self.message), self._s("label"))
            return out
        fails = sum(not c.ok for c in r.checks)
        out.append("✔ all checks pass" if r.ok else f"✖ {fails} check(s) fail",
                   self._s("pass" if r.ok else "fail"))
        out.append(f"   {r.style_head} · names {r.key_style} · config {r.config_style} · "
                   f"{r.weights}: {', '.join(r.files)}\n", self._s("label"))
        rows = r.provenance
        label = max(len(k) for k, _ in rows)
        root = self.root.rstrip("/") + "/" if self.root.strip("/") else None
        for k, v in rows:
            out.append(f" {k.ljust(label)}  ", self._s("label"))
            out.append(terminal_text(v[len(root):] if root and v.startswith(root) else v) + "\n")
        width = max((len(c.name) for c in r.checks), default=0)
        for c in r.checks:
            out.append(" PASS " if c.ok else " FAIL ", self._s("pass" if c.ok else "fail"))
            out.append(terminal_text(f" {c.name.ljust(width)}  {c.detail}") + "\n")
        out.append("\n")
        for line in config_lines(r.summary):
            out.append(line + "\n")
        out.append("\n")
        name_w = max([len(t.name) for t in r.tensors] + [6])
        out.append(f"{'tensor'.ljust(name_w)}  {'shape':<14} {'dtype':<8} {'size':>8}\n",
                   self._s("header"))
        for t in r.tensors:
            shape = "×".join(str(x) for x in t.shape) or "scalar"
            out.append(f"{t.name.ljust(name_w)}  {shape:<14} {t.dtype:<8} "
                       f"{fmt_bytes(t.bytes):>8}\n")
        out.append(f"{'total'.ljust(name_w)}  {'':<14} {'':<8} "
                   f"{fmt_bytes(r.total_bytes):>8}", self._s("label"))
        return out
