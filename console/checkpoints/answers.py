"""What vLLM servers, the engine and a host answer the checkpoints services, parsed once into
frozen records: a chat completion and its per-request acceptance, /v1/models, /weight_info,
/server_info, `engine eval`'s result, and the host's port check. A reply of the wrong shape is
one line naming the request and the field (BadAnswer), or a record that says unknown where the
caller can go on without the field."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from console.checkpoints.journal import SpecCounts, count, text
from console.checkpoints.results import _is_int, _is_number
from console.errors import ConsoleError

_KINDS = {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
          type(None): "null"}


class BadAnswer(ConsoleError):
    """A server's answer of the wrong shape: one line naming the request and the field."""

    def __init__(self, what: str, field: str, got: Any, want: str) -> None:
        super().__init__(f"{what}: `{field}` is {_kind(got)}, not {want}")


def _kind(v: Any) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if type(v) in _KINDS:
        return _KINDS[type(v)]
    return f"the number {v!r}" if isinstance(v, (int, float)) else type(v).__name__


def _ids(v: Any) -> tuple[int, ...] | None:
    if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return tuple(v)
    return None


# -- /v1/chat/completions and /v1/models ----------------------------------------------------------

@dataclass(frozen=True)
class Answer:
    """One chat completion as the replay uses it."""

    completion_tokens: int
    text: str | None
    token_ids: tuple[int, ...] | None
    prompt_token_ids: tuple[int, ...] | None
    finish_reason: str | None
    spec: SpecCounts | None      # per_request(): vLLM's per-request acceptance


def parse_answer(doc: Any, what: str) -> Answer:
    """A /v1/chat/completions answer (BadAnswer naming the field that is not vLLM's shape)."""
    if not isinstance(doc, dict):
        raise BadAnswer(what, "answer", doc, "an object")
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise BadAnswer(what, "choices", choices, "a list of objects")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise BadAnswer(what, "choices[0].message", message, "an object")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise BadAnswer(what, "choices[0].message.content", content, "a string")
    usage = doc.get("usage")
    if not isinstance(usage, dict):
        raise BadAnswer(what, "usage", usage, "an object")
    tokens = usage.get("completion_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        raise BadAnswer(what, "usage.completion_tokens", tokens, "a count")
    metrics = doc.get("metrics")
    reason = choice.get("finish_reason")
    return Answer(completion_tokens=tokens, text=content,
                  token_ids=_ids(choice.get("token_ids")),
                  prompt_token_ids=_ids(doc.get("prompt_token_ids")),
                  finish_reason=reason if isinstance(reason, str) else None,
                  spec=per_request(metrics.get("speculative_decoding")
                                   if isinstance(metrics, dict) else None))


def per_request(spec: Any) -> SpecCounts | None:
    """One answer's `metrics.speculative_decoding` (vLLM's --per-request-spec-decode-metrics)
    as figures: None when the server does not send it or it is not what vLLM 0.32 writes."""
    if not isinstance(spec, dict):
        return None
    try:
        steps, accepted = int(spec["num_spec_steps"]), int(spec["num_accepted_draft_tokens"])
        drafted = int(spec["num_draft_tokens"])
        hist = tuple(int(x) for x in spec.get("acceptance_histogram") or [])
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    return SpecCounts(1 + accepted / steps if steps else None, steps, accepted, drafted, hist)


def parse_model_id(doc: Any, what: str) -> str:
    """The first model /v1/models lists."""
    if not isinstance(doc, dict):
        raise BadAnswer(what, "answer", doc, "an object")
    data = doc.get("data")
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        raise BadAnswer(what, "data", data, "a list of models")
    mid = data[0].get("id")
    if not isinstance(mid, str) or not mid:
        raise BadAnswer(what, "data[0].id", mid, "a model name")
    return mid


@dataclass(frozen=True)
class ModelEntry:
    """One of /v1/models' entries, as `serve` compares it: the name and the folder it serves."""

    id: Any
    root: Any
    max_model_len: Any

    @property
    def served(self) -> Any:
        """The folder or name the server loaded (its root, else its id)."""
        return self.root or self.id

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "root": self.root, "max_model_len": self.max_model_len}


def model_entries(doc: Any) -> list[ModelEntry]:
    """/v1/models' entries (ValueError when the JSON is not /v1/models')."""
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise ValueError("no `data` list in /v1/models' answer")
    return [ModelEntry(m.get("id"), m.get("root"), m.get("max_model_len")) for m in data
            if isinstance(m, dict)]


# -- the weight-update routes ---------------------------------------------------------------------

def weight_version(doc: Any) -> str | None:
    """The weight version a /weight_info answer names (None: none)."""
    return text(doc.get("weight_version")) or None if isinstance(doc, dict) else None


@dataclass(frozen=True)
class StartedConfig:
    """What /server_info?config_format=json says a server started with."""

    drafter: str | None
    verifier: str | None
    k: int | None

    @classmethod
    def parse(cls, doc: Any) -> StartedConfig:
        cfg = doc.get("vllm_config") if isinstance(doc, dict) else None
        spec = cfg.get("speculative_config") if isinstance(cfg, dict) else None
        model = cfg.get("model_config") if isinstance(cfg, dict) else None
        k = count(spec.get("num_speculative_tokens"), 1) if isinstance(spec, dict) else None
        return cls(text(spec.get("model")) if isinstance(spec, dict) else None,
                   text(model.get("model")) if isinstance(model, dict) else None, k)


def served_drafter(argv: Sequence[str]) -> str | None:
    """The drafter a `vllm serve` command line names in its --speculative-config."""
    for i, w in enumerate(argv[:-1]):
        if w == "--speculative-config":
            try:
                spec = json.loads(argv[i + 1])
            except ValueError:
                return None
            model = spec.get("model") if isinstance(spec, dict) else None
            return model if isinstance(model, str) else None
    return None


# -- engine eval ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class EvalResult:
    """engine eval's answer (engine/training/evaluate.py, vllm_eval.py), as the console shows it."""

    acceptance_length: float
    per_position: tuple[float, ...]
    drafts: int
    samples: int | None
    k: int
    path: str      # "transformers" or "vLLM engine"

    @classmethod
    def parse(cls, d: Any, k: int, path: str) -> EvalResult:
        if not isinstance(d, dict):
            raise ConsoleError(f"engine eval answered {type(d).__name__}, not a result")
        tau, pos, drafts = d.get("acceptance_length"), d.get("per_position"), d.get("drafts")
        if not _is_number(tau) or not isinstance(tau, (int, float)):
            raise ConsoleError(f"engine eval: acceptance_length {tau!r} is not a number "
                               "(no draft was made: are the held-out samples empty?)")
        if not isinstance(pos, list) or not all(_is_number(p) for p in pos):
            raise ConsoleError(f"engine eval: per_position {str(pos)[:80]} is not a list of "
                               "numbers")
        if not _is_int(drafts) or not isinstance(drafts, int):
            raise ConsoleError(f"engine eval: drafts {drafts!r} is not a whole number")
        samples = d.get("samples")
        return cls(float(tau), tuple(float(p) for p in pos), drafts,
                   samples if _is_int(samples) else None, k, path)

    def line(self) -> str:
        """One line, as `engine eval` prints it."""
        pos = ", ".join(f"{p:.3f}" for p in self.per_position)
        samples = f", {self.samples} samples" if self.samples is not None else ""
        return (f"acceptance length {self.acceptance_length:.2f} (k={self.k}); per position "
                f"{pos} ({self.drafts} drafts{samples}; {self.path})")

    def to_json(self) -> dict[str, object]:
        return {"acceptance_length": self.acceptance_length,
                "per_position": list(self.per_position), "drafts": self.drafts,
                "samples": self.samples, "k": self.k, "path": self.path}


# -- the host's port check ----------------------------------------------------------------------

@dataclass(frozen=True)
class PortHolder:
    pid: int
    pgid: int
    cmd: str


@dataclass(frozen=True)
class PortState:
    """What the host says of a port: bindable, and the processes (of this user) listening."""

    free: bool
    why: str
    holders: tuple[PortHolder, ...]

    @classmethod
    def parse(cls, text: str) -> PortState:
        doc = json.loads(text)
        if not isinstance(doc, dict) or not isinstance(doc.get("holders"), list):
            raise ValueError("not the port check's answer")
        return cls(free=doc.get("free") is True, why=str(doc.get("why") or ""),
                   holders=tuple(PortHolder(int(h["pid"]), int(h["pgid"]), str(h["cmd"])[:200])
                                 for h in doc["holders"] if isinstance(h, dict)))
