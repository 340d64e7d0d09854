"""vLLM log lines -> typed metrics records (pure functions; every stats-line format vLLM
writes: docs/eagle3.md#vllm-log-lines).

Two lines matter to an EAGLE-3 user watching a server:

    INFO 11-30 12:01:02 [loggers.py:123] Engine 000: Avg prompt throughput: 12.3 tokens/s,
      Avg generation throughput: 456.7 tokens/s, Running: 4 reqs, Waiting: 0 reqs,
      GPU KV cache usage: 12.5%, Prefix cache hit rate: 40.0%
    INFO 11-30 12:01:02 [loggers.py:140] SpecDecoding metrics: Mean acceptance length: 2.84,
      Accepted throughput: 120.50 tokens/s, Drafted throughput: 210.00 tokens/s, Accepted: 1205
      tokens, Drafted: 2100 tokens, Per-position acceptance rate: 0.812, 0.601, 0.427,
      Avg Draft acceptance rate: 57.4%

Versions differ (older ones print `Draft acceptance rate` first, v0 printed `Speculative
metrics: ... Number of accepted tokens: N` and `Pending:` for waiting), forks add fields, the
prefix may be `N Engines Aggregated:`, a process tag `(APIServer pid=1234)` may lead and ANSI
colours may be anywhere. So a body is parsed by its labels (`Label: value` parts; the
per-position value itself contains commas), never by position, and every unknown label lands in
`extra`. A line that is not one of the two is not a metric: `parse_line` returns None.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_TIMESTAMP = re.compile(r"(?<![\d-])(\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?)(?![\d:])")
_LEVEL = re.compile(r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")
_TAG = re.compile(r"\(([A-Za-z][\w.-]*(?: [\w.-]+)* pid=\d+)\)")
_ENGINE = re.compile(r"Engine (\d+):\s*$")
_AGGREGATED = re.compile(r"(\d+) Engines Aggregated:\s*$")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")

#: every metrics line contains one of these (the cheap filter): a follower's
#: `LineBatch.containing(MARKERS)` picks the candidate lines of a busy log without touching the rest
MARKERS = ("throughput:", "metrics:")
_ENGINE_MARKERS = ("Avg prompt throughput:", "Avg generation throughput:")
_SPEC_MARKERS = ("SpecDecoding metrics:", "Speculative metrics:")


@dataclass(frozen=True)
class EngineStats:
    """The periodic engine-stats line."""

    timestamp: str | None                  # "11-30 12:01:02" as printed (vLLM prints no year)
    level: str | None                      # INFO, DEBUG, ...
    process: str | None                    # "APIServer pid=1234" when tagged
    engine: int | None                     # 0 for "Engine 000:", None when aggregated/absent
    engines: int                           # N for "N Engines Aggregated:", else 1
    prompt_throughput: float | None        # tokens/s
    generation_throughput: float | None    # tokens/s
    running: int | None                    # requests
    waiting: int | None                    # requests (v0 called it Pending)
    kv_cache_usage_pct: float | None       # 0-100
    prefix_cache_hit_rate_pct: float | None  # 0-100
    extra: dict[str, Any] = field(default_factory=dict)  # unknown labels: number or raw text

    kind = "engine"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}


@dataclass(frozen=True)
class SpecDecodeStats:
    """The `SpecDecoding metrics` line (speculative decoding acceptance)."""

    timestamp: str | None
    level: str | None
    process: str | None
    engine: int | None
    engines: int
    mean_acceptance_length: float | None   # 1 + accepted / drafts
    accepted: int | None                   # tokens in this interval
    drafted: int | None                    # tokens in this interval
    accepted_throughput: float | None      # tokens/s
    drafted_throughput: float | None       # tokens/s
    per_position: tuple[float, ...]        # acceptance rate of draft position 0, 1, ...
    draft_acceptance_rate_pct: float | None  # 0-100 (v0 printed a 0-1 fraction: scaled)
    extra: dict[str, Any] = field(default_factory=dict)

    kind = "spec_decode"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["per_position"] = list(self.per_position)
        return {"kind": self.kind, **d}


Metrics = EngineStats | SpecDecodeStats


def strip_ansi(text: str) -> str:
    """text without ANSI escape sequences (colours, cursor moves, OSC titles)."""
    return _ANSI.sub("", text) if "\x1b" in text else text


def parse_line(line: str) -> Metrics | None:
    """The metrics record a vLLM log line carries, or None for any other line (never raises)."""
    # cheap rejection first: a follower calls this on every line of a busy log
    if MARKERS[0] not in line and MARKERS[1] not in line:
        return None
    line = strip_ansi(line).rstrip("\r\n")
    for marker in _SPEC_MARKERS:
        at = line.find(marker)
        if at >= 0:
            return _spec(line[:at], line[at + len(marker):])
    for marker in _ENGINE_MARKERS:
        at = line.find(marker)
        if at >= 0:
            return _engine(line[:at], line[at:])
    return None


# -- parts ----------------------------------------------------------------------------------------

def _labels(body: str) -> dict[str, str]:
    """`A: 1, B c: 2 x, D: 0.1, 0.2` -> {"a": "1", "b c": "2 x", "d": "0.1, 0.2"}.

    A comma-separated part that starts with a letter and has a colon starts a new label; any
    other part (a number of the per-position list) continues the previous value."""
    out: dict[str, str] = {}
    key: str | None = None
    for part in body.split(","):
        text = part.strip()
        colon = text.find(":")
        if colon > 0 and text[0].isalpha():
            key = " ".join(text[:colon].split()).lower()
            if key in out:
                key = None                     # a repeated label: the first one counts
            else:
                out[key] = text[colon + 1:].strip()
        elif key is not None:
            out[key] += "," + part
    return {k: v.strip().rstrip(".") for k, v in out.items()}


def _head(prefix: str) -> dict[str, Any]:
    """timestamp, level, process tag and engine id from the text before the body."""
    ts = _TIMESTAMP.search(prefix)
    level = _LEVEL.search(prefix)
    tag = _TAG.search(prefix)
    engine = _ENGINE.search(prefix)
    agg = _AGGREGATED.search(prefix)
    return {"timestamp": ts.group(1) if ts else None,
            "level": level.group(1) if level else None,
            "process": tag.group(1) if tag else None,
            "engine": int(engine.group(1)) if engine else None,
            "engines": int(agg.group(1)) if agg else 1}


def _num(text: str | None) -> float | None:
    """The first number in text ("12.5%", "1205 tokens", "456.7 tokens/s")."""
    if not text:
        return None
    try:  # the usual shape, "<number>[%] [unit]", without a regex
        return float(text.split(None, 1)[0].rstrip("%,"))
    except ValueError:
        m = _NUMBER.search(text)
        return float(m.group(0)) if m else None


def _int(text: str | None) -> int | None:
    v = _num(text)
    return int(v) if v is not None else None


def _pct(text: str | None) -> float | None:
    """A percentage; a bare fraction (no %, at most 1) as printed by v0 is scaled to 0-100."""
    v = _num(text)
    if v is None or text is None:
        return None
    return v * 100.0 if "%" not in text and 0.0 <= v <= 1.0 else v


def _value(text: str) -> Any:
    """An unknown field: its number when it is one number (with an optional unit), else text."""
    nums = _NUMBER.findall(text)
    if len(nums) == 1 and _NUMBER.match(text.strip()):
        v = float(nums[0])
        return int(v) if v.is_integer() and "." not in nums[0] else v
    return text


def _pop(parts: dict[str, str], *names: str) -> str | None:
    value = None
    for n in names:
        v = parts.pop(n, None)
        if value is None:
            value = v
    return value


def _engine(prefix: str, body: str) -> EngineStats:
    parts = _labels(body)
    kv = _pop(parts, "gpu kv cache usage", "kv cache usage")
    if kv is None:  # vLLM's CPU build prints "CPU KV cache usage" (v0's CPU one was swap space)
        kv = _pop(parts, *[k for k in parts if k.endswith(" kv cache usage")])
    return EngineStats(
        **_head(prefix),
        prompt_throughput=_num(_pop(parts, "avg prompt throughput")),
        generation_throughput=_num(_pop(parts, "avg generation throughput")),
        running=_int(_pop(parts, "running")),
        waiting=_int(_pop(parts, "waiting", "pending")),
        kv_cache_usage_pct=_pct(kv),
        prefix_cache_hit_rate_pct=_pct(_pop(parts, "prefix cache hit rate")),
        extra={k: _value(v) for k, v in parts.items()})


def _spec(prefix: str, body: str) -> SpecDecodeStats:
    parts = _labels(body)
    per_pos = _pop(parts, "per-position acceptance rate", "per position acceptance rate")
    return SpecDecodeStats(
        **_head(prefix),
        mean_acceptance_length=_num(_pop(parts, "mean acceptance length")),
        accepted=_int(_pop(parts, "accepted", "number of accepted tokens")),
        drafted=_int(_pop(parts, "drafted", "number of draft tokens")),
        accepted_throughput=_num(_pop(parts, "accepted throughput")),
        drafted_throughput=_num(_pop(parts, "drafted throughput")),
        per_position=tuple(float(x) for x in _NUMBER.findall(per_pos or "")),
        draft_acceptance_rate_pct=_pct(_pop(parts, "avg draft acceptance rate",
                                            "draft acceptance rate")),
        extra={k: _value(v) for k, v in parts.items()})
