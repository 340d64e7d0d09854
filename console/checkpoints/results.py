"""What the engine's checkpoint commands and the host's checkpoint scan answer, parsed once.

`inspect --json` becomes an InspectReport (its checks, styles, the verifier and provenance step
the dialogs propose; the whole report kept for `--json` and the text views), `convert --json` a
ConvertSummary (shown by one function, `convert_line`), and the scan's JSON a list of
Checkpoint records. A field of the wrong type is refused here, with a one-line ConsoleError
naming it, never met later as a KeyError in a pane.
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from console.errors import ConsoleError
from engine.inspect_report import provenance_rows, style_head


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class Tensor:
    """One tensor of the checkpoint's weights: name, shape, dtype and size in bytes."""

    name: str
    shape: tuple[int, ...] = ()
    dtype: str = ""
    bytes: int | None = None


@dataclass(frozen=True)
class ConfigSummary:
    """The sizes inspect reports from the drafter's config (None: not reported as a number)."""

    hidden_size: int | None = None
    target_hidden_size: int | None = None
    intermediate_size: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    vocab_size: int | None = None
    draft_vocab_size: int | None = None
    aux_layers: str = "None"        # as reported: the ids, or the words for the defaults
    rope_type: str = "default"
    rope_theta: float | None = None
    torch_dtype: str = "None"

    @classmethod
    def parse(cls, c: Mapping[str, Any]) -> ConfigSummary:
        rope = c.get("rope_scaling")
        rope_type = rope.get("rope_type", "default") if isinstance(rope, dict) else "default"
        theta = c.get("rope_theta")
        return cls(**{k: _int(c.get(k)) for k in SIZES}, aux_layers=str(c.get("aux_layer_ids")),
                   rope_type=str(rope_type), torch_dtype=str(c.get("torch_dtype")),
                   rope_theta=theta if _is_number(theta) else None)


#: the integer fields of ConfigSummary, named as inspect's config summary names them
SIZES = ("hidden_size", "target_hidden_size", "intermediate_size", "num_attention_heads",
         "num_key_value_heads", "head_dim", "vocab_size", "draft_vocab_size")


@dataclass(frozen=True)
class InspectReport:
    """engine inspect's report (engine/commands/inspect.py `collect`), as the console uses it:
    every field the inspect view draws, typed; `data` keeps the whole report for `--json`,
    the text render and the swap checks."""

    ok: bool
    checks: tuple[Check, ...] = ()
    path: str = ""
    format: str = ""
    style: str = ""                  # the export style its writer recorded ("": the format)
    key_style: str = ""
    config_style: str = ""
    weights: str = ""
    files: tuple[str, ...] = ()
    tensors: tuple[Tensor, ...] = ()  # by name
    total_bytes: int | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    summary: ConfigSummary = ConfigSummary()
    # the provenance as the engine words it: (label, value) rows, provenance_rows's
    provenance: tuple[tuple[str, str], ...] = ()
    step: int | None = None          # the training step its provenance names
    data: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def parse(cls, d: object) -> InspectReport:
        if not isinstance(d, dict):
            raise ConsoleError(f"engine inspect answered {type(d).__name__}, not a report")
        checks = [Check(_text(c.get("name")), c.get("ok") is True, _text(c.get("detail")))
                  for c in _list(d.get("checks")) if isinstance(c, dict)]
        cfg, prov, files = d.get("config"), d.get("provenance"), d.get("files")
        config: dict[str, Any] = cfg if isinstance(cfg, dict) else {}
        provenance: dict[str, Any] | None = prov if isinstance(prov, dict) else None
        return cls(ok=d.get("ok") is True, checks=tuple(checks), path=_text(d.get("path")),
                   format=_text(d.get("format")), style=_text(d.get("style")),
                   key_style=_text(d.get("key_style")),
                   config_style=_text(d.get("config_style")), weights=_text(d.get("weights")),
                   files=tuple(_text(f) for f in _list(files)),
                   tensors=_tensors(d.get("tensors")), total_bytes=_int(d.get("total_bytes")),
                   config=config, summary=ConfigSummary.parse(config),
                   provenance=tuple(provenance_rows(provenance)),
                   step=_int(provenance.get("step")) if provenance is not None else None,
                   data=d)

    @property
    def style_head(self) -> str:
        """`eagle format`, or `vllm export of eagle format` (engine/inspect_report.py)."""
        return style_head(self.format, self.style)

    @property
    def verifier(self) -> str:
        """The verifier its config names ("" when none)."""
        return _text(self.config.get("verifier"))

    @property
    def draft_vocab_size(self) -> int | None:
        return self.summary.draft_vocab_size

    def first_failed(self) -> Check | None:
        return next((c for c in self.checks if not c.ok), None)

    def check_lines(self) -> list[str]:
        """`PASS  name                  detail`, one line per check."""
        return [f"{'PASS' if c.ok else 'FAIL'}  {c.name:<21} {c.detail}" for c in self.checks]

    def to_json(self) -> dict[str, Any]:
        return dict(self.data)


def _tensors(t: object) -> tuple[Tensor, ...]:
    if not isinstance(t, dict):
        return ()
    return tuple(Tensor(str(name), tuple(x for x in _list(v.get("shape")) if _is_int(x)),
                        str(v.get("dtype")), _int(v.get("bytes")))
                 for name, v in sorted(t.items()) if isinstance(v, dict))


@dataclass(frozen=True)
class ConvertSummary:
    """engine convert's answer: where the result went and what it took."""

    dst: str
    source_format: str = ""
    tensors: int | None = None
    bytes: int = 0
    seconds: float = 0.0
    data: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def parse(cls, d: object, dst: str) -> ConvertSummary:
        """d: the result data; dst: the destination asked for (when the summary names none)."""
        if not isinstance(d, dict):
            raise ConsoleError(f"engine convert answered {type(d).__name__}, not a summary")
        tensors, size, secs = d.get("tensors"), d.get("bytes"), d.get("seconds")
        return cls(dst=_text(d.get("dst")) or dst, source_format=_text(d.get("source_format")),
                   tensors=tensors if isinstance(tensors, int) else None,
                   bytes=size if isinstance(size, int) and size >= 0 else 0,
                   seconds=float(secs) if isinstance(secs, (int, float)) and _is_number(secs)
                   else 0.0, data=d)

    def to_json(self) -> dict[str, Any]:
        return dict(self.data)


def convert_line(summary: ConvertSummary, to: str, *, wrote: bool = False) -> str:
    """The one way a conversion is told: `converted to vllm: DST (N tensors, X MiB, Y s)`, or
    with wrote, `wrote DST (vllm style from eagle, N tensors, X MiB, Y s)` (the subcommand)."""
    sizes = (f"{summary.tensors} tensors, {summary.bytes / 2**20:.1f} MiB, "
             f"{summary.seconds:.{2 if wrote else 1}f} s")
    if wrote:
        return f"wrote {summary.dst} ({to} style from {summary.source_format}, {sizes})"
    return f"converted to {to}: {summary.dst} ({sizes})"


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint folder on a host."""

    path: str
    source: str          # "configured", "run <run-id>" or "converted"
    mtime: float
    bytes: int

    @property
    def name(self) -> str:
        return posixpath.basename(self.path.rstrip("/")) or self.path


def parse_scan(data: object, host: str) -> tuple[list[Checkpoint], list[tuple[str, str]]]:
    """The scan's answer: (checkpoints found, configured folders it could not read, with why).
    An entry with a field of the wrong type makes the whole answer refused, naming it."""
    if not isinstance(data, dict):
        raise ConsoleError(f"{host}: the checkpoint scan printed no list")
    found = []
    for i, d in enumerate(data.get("found") or []):
        ok = isinstance(d, dict) and isinstance(d.get("path"), str) and \
            isinstance(d.get("source"), str) and _is_number(d.get("mtime")) and \
            _is_int(d.get("bytes"))
        if not ok:
            raise ConsoleError(f"{host}: the checkpoint scan's entry {i} is not a checkpoint "
                               f"(path, source, mtime, bytes): {str(d)[:80]}")
        found.append(Checkpoint(d["path"], d["source"], float(d["mtime"]), d["bytes"]))
    missing = [(str(m[0]), str(m[1])) for m in data.get("missing") or []
               if isinstance(m, (list, tuple)) and len(m) == 2]
    return found, missing


def _text(v: object) -> str:
    return v if isinstance(v, str) else "" if v is None else str(v)


def _int(x: object) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _list(x: object) -> list[Any]:
    return x if isinstance(x, list) else []


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
