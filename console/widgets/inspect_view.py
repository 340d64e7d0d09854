"""A checkpoint's inspect report (engine/commands/inspect.py's JSON) drawn for the pane: the
verdict and format first, then the provenance (run, step and held-out tau, finetune source,
data and vocab hashes: what tells out/best from out/final), the checks (PASS / FAIL in the
theme's success / error colours), config summary and the tensor table. An engine error is
shown whole, in the error colour."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.text import Text
from textual.widget import Widget

from console.text import terminal_text
from console.widgets.meters import fmt_bytes
from engine.inspect_report import provenance_rows, style_head


def config_lines(c: dict[str, Any]) -> list[str]:
    rope = (c.get("rope_scaling") or {}).get("rope_type", "default") if isinstance(
        c.get("rope_scaling"), dict) else "default"
    return [f"H {c.get('hidden_size')}  Ht {c.get('target_hidden_size')}  I "
            f"{c.get('intermediate_size')}  heads {c.get('num_attention_heads')}/"
            f"{c.get('num_key_value_heads')}  head_dim {c.get('head_dim')}",
            f"V {c.get('vocab_size')}  Vd {c.get('draft_vocab_size')}  aux layers "
            f"{c.get('aux_layer_ids')}  rope {rope} θ {c.get('rope_theta')}  dtype "
            f"{c.get('torch_dtype')}"]


class InspectView(Widget):
    """Render-only: show_report / show_error / show_text replace what is drawn."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "inspect--pass", "inspect--fail", "inspect--label", "inspect--header", "inspect--error"}
    DEFAULT_CSS = "InspectView { height: auto; }"

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.report: dict[str, Any] | None = None
        self.heading = ""
        self.error: str | None = None
        self.message = "Select a checkpoint to inspect it."
        self.root = ""   # the host's root: provenance paths under it are shown relative to it

    @property
    def plain(self) -> str:
        return self.render().plain

    def show_report(self, report: dict[str, Any], heading: str = "") -> None:
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
        ok = bool(r.get("ok"))
        checks = r.get("checks") or []
        fails = sum(not c.get("ok") for c in checks)
        out.append("✔ all checks pass" if ok else f"✖ {fails} check(s) fail",
                   self._s("pass" if ok else "fail"))
        out.append(f"   {style_head(r)} · names {r.get('key_style')} · config "
                   f"{r.get('config_style')} · {r.get('weights')}: "
                   f"{', '.join(r.get('files') or [])}\n", self._s("label"))
        rows = provenance_rows(r.get("provenance"))
        label = max(len(k) for k, _ in rows)
        root = self.root.rstrip("/") + "/" if self.root.strip("/") else None
        for k, v in rows:
            out.append(f" {k.ljust(label)}  ", self._s("label"))
            out.append(terminal_text(v[len(root):] if root and v.startswith(root) else v) + "\n")
        width = max((len(str(c.get("name", ""))) for c in checks), default=0)
        for c in checks:
            good = bool(c.get("ok"))
            out.append(" PASS " if good else " FAIL ", self._s("pass" if good else "fail"))
            out.append(terminal_text(f" {str(c.get('name', '')).ljust(width)}  "
                                     f"{c.get('detail', '')}") + "\n")
        out.append("\n")
        for line in config_lines(r.get("config") or {}):
            out.append(line + "\n")
        tensors = r.get("tensors") or {}
        out.append("\n")
        name_w = max([len(n) for n in tensors] + [6])
        out.append(f"{'tensor'.ljust(name_w)}  {'shape':<14} {'dtype':<8} {'size':>8}\n",
                   self._s("header"))
        for name, t in sorted(tensors.items()):
            shape = "×".join(str(x) for x in t.get("shape") or []) or "scalar"
            out.append(f"{name.ljust(name_w)}  {shape:<14} {str(t.get('dtype')):<8} "
                       f"{fmt_bytes(t.get('bytes')):>8}\n")
        out.append(f"{'total'.ljust(name_w)}  {'':<14} {'':<8} "
                   f"{fmt_bytes(r.get('total_bytes')):>8}", self._s("label"))
        return out
