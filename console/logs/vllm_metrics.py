"""vLLM's Prometheus `/metrics` page -> acceptance figures (pure: no I/O, no clock;
docs/eagle3.md#vllm-metrics).

vLLM's exact counters beat its log lines: the log prints a rounded summary every 10 s, while
`/metrics` gives the running totals, so any span's figures are exact differences.

    vllm:spec_decode_num_drafts_total                     drafts proposed (one per decode step
                                                          of a request that speculated)
    vllm:spec_decode_num_draft_tokens_total               draft tokens proposed
    vllm:spec_decode_num_accepted_tokens_total            draft tokens accepted
    vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}
                                                          accepted at draft position i
    vllm:generation_tokens_total, vllm:prompt_tokens_total
    vllm:num_requests_running, vllm:num_requests_waiting  gauges
    vllm:kv_cache_usage_perc                              gauge, a 0-1 fraction despite the name
                                                          (vLLM <= 0.10: vllm:gpu_cache_usage_perc)

Acceptance length is 1 + accepted / drafts (the bonus token counts, as vLLM logs it), the
acceptance rate accepted / draft tokens, position i's rate accepted_i / drafts. vLLM v0 had no
drafts counter: its acceptance length and per-position rates are None, its rate is still exact.

Every sample name is read with `_total` stripped, because prometheus_client's parser strips it
from counter *family* names but not from sample names, and an untyped page keeps it everywhere.
A counter's `_created` samples (its creation time, ~1.7e9: prometheus_client writes one per
label set) are never read as its value.
Several engines (data parallel) each label their own series: counters are summed, so are the
request gauges; the KV-cache fraction is their mean. A counter that goes down (a restarted
server) starts a new series: figures never span a restart, so they are never negative.

Generation and prompt tokens/s are the two counters' own differences over the span. They read
the same in an idle span (0 and 0) and in one whose requests produced as many tokens as their
prompts held (a benchmark with input length = output length): vLLM's log line then prints the
same pair (recorded: tests/fixtures/vllm/metrics-0.32.0-cpu-{1,2}.txt, 16 and 16 tokens).
"""

from __future__ import annotations

import math
import re
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from console.logs.vllm_log import EngineStats, SpecDecodeStats

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
GENERATION = "vllm:generation_tokens"
PROMPT = "vllm:prompt_tokens"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
#: renamed in vLLM 0.9 (the old name was dropped later): the new one wins when both are there
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")

_COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED, GENERATION, PROMPT)
_WANTED = frozenset((*_COUNTERS, PER_POSITION, RUNNING, WAITING, *KV_USAGE))
#: the lines (samples, HELP and TYPE) of the families we read: a page is mostly histogram
#: buckets, and the parser costs ~60 us a line, so only these go through it (10x cheaper)
_OURS = re.compile(r"^(?:# (?:HELP|TYPE) )?(?:" + "|".join(
    re.escape(n) for n in sorted(_WANTED, key=len, reverse=True)) + r")(?:_total)?[\s{].*$",
    re.MULTILINE)


# -- one scrape -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Snapshot:
    """What one scrape said. Counters are the server's totals since it started."""

    t: float                          # unix time of the scrape (shown)
    clock: float                      # a monotonic clock (differences)
    drafts: float | None
    draft_tokens: float | None
    accepted: float | None
    per_position: tuple[float, ...]   # accepted tokens at draft position 0, 1, ...
    generation_tokens: float | None
    prompt_tokens: float | None
    running: float | None
    waiting: float | None
    kv_cache_usage: float | None      # fraction 0-1

    def counters(self) -> dict[str, float]:
        """Every counter present, by name (positions as `name[i]`): what reset detection
        compares."""
        values = (self.drafts, self.draft_tokens, self.accepted, self.generation_tokens,
                  self.prompt_tokens)
        out = {n: v for n, v in zip(_COUNTERS, values, strict=True) if v is not None}
        out.update({f"{PER_POSITION}[{i}]": v for i, v in enumerate(self.per_position)})
        return out


def parse_snapshot(text: str, t: float, clock: float | None = None) -> Snapshot:
    """Parse a /metrics page (Prometheus text format, prometheus_client's parser). ValueError
    when it is not that format or carries no vLLM metric at all (the URL is not vLLM's)."""
    from prometheus_client.parser import text_string_to_metric_families  # light, but only here

    values: dict[str, list[float]] = {}
    positions: dict[int, float] = {}
    if "vllm:" not in text:
        # still parsed, so that a page that is not Prometheus text at all says so
        list(text_string_to_metric_families(text))
        raise ValueError("no vllm: metrics on the page (is it a vLLM server's /metrics?)")
    ours = "\n".join(m.group(0) for m in _OURS.finditer(text)) + "\n"
    for family in text_string_to_metric_families(ours):
        for s in family.samples:
            if s.name.endswith("_created"):  # the filter keeps them out already; never a value
                continue
            name = s.name[:-6] if s.name.endswith("_total") else s.name
            if name not in _WANTED or not math.isfinite(s.value):
                continue
            if name == PER_POSITION:
                try:
                    pos = int(s.labels.get("position", ""))
                except ValueError:
                    continue
                if 0 <= pos < 64:  # a draft is a handful of tokens; anything else is noise
                    positions[pos] = positions.get(pos, 0.0) + s.value
                continue
            values.setdefault(name, []).append(s.value)
    if not values and not positions:
        raise ValueError("none of vLLM's request or token metrics on the page")

    def total(name: str) -> float | None:
        v = values.get(name)
        return sum(v) if v else None

    kv = next((values[n] for n in KV_USAGE if values.get(n)), None)
    k = max(positions) + 1 if positions else 0
    return Snapshot(
        t=t, clock=t if clock is None else clock, drafts=total(DRAFTS),
        draft_tokens=total(DRAFT_TOKENS), accepted=total(ACCEPTED),
        per_position=tuple(positions.get(i, 0.0) for i in range(k)),
        generation_tokens=total(GENERATION), prompt_tokens=total(PROMPT),
        running=total(RUNNING), waiting=total(WAITING),
        kv_cache_usage=sum(kv) / len(kv) if kv else None)


def is_reset(before: Snapshot, after: Snapshot) -> bool:
    """True when `after` cannot continue `before`'s series: a counter went down or vanished
    (the server restarted, or another one answers on the port)."""
    now = after.counters()
    return any(name not in now or now[name] < v for name, v in before.counters().items())


# -- figures over a span --------------------------------------------------------------------------

@dataclass(frozen=True)
class Figures:
    """Acceptance and throughput over a span of counters."""

    seconds: float | None
    drafts: int | None
    draft_tokens: int | None
    accepted: int | None
    acceptance_length: float | None       # 1 + accepted / drafts
    acceptance_rate: float | None         # accepted / draft tokens (0-1)
    per_position: tuple[float, ...]       # accepted at position i / drafts (0-1)
    generation_tokens: int | None
    generation_tokens_per_s: float | None
    prompt_tokens_per_s: float | None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["per_position"] = list(self.per_position)
        return d


def _int(v: float | None) -> int | None:
    return None if v is None else int(round(v))


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def figures(drafts: float | None, draft_tokens: float | None, accepted: float | None,
            per_position: tuple[float, ...], generation: float | None, prompt: float | None,
            seconds: float | None, gen_n: float | None, prompt_n: float | None) -> Figures:
    """Figures from counter amounts; tokens/s are gen_n and prompt_n tokens over seconds."""
    per_s = seconds if seconds and seconds > 0 else None
    return Figures(
        seconds=seconds, drafts=_int(drafts), draft_tokens=_int(draft_tokens),
        accepted=_int(accepted),
        acceptance_length=1 + accepted / drafts if accepted is not None and drafts else None,
        acceptance_rate=_ratio(accepted, draft_tokens),
        per_position=tuple(p / drafts for p in per_position) if drafts else (),
        generation_tokens=_int(generation),
        generation_tokens_per_s=_ratio(gen_n, per_s), prompt_tokens_per_s=_ratio(prompt_n, per_s))


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def interval(before: Snapshot, after: Snapshot) -> Figures:
    """Figures between two scrapes of one series (no reset in between)."""
    k = min(len(before.per_position), len(after.per_position))
    gen = _diff(before.generation_tokens, after.generation_tokens)
    prompt = _diff(before.prompt_tokens, after.prompt_tokens)
    return figures(
        _diff(before.drafts, after.drafts), _diff(before.draft_tokens, after.draft_tokens),
        _diff(before.accepted, after.accepted),
        tuple(after.per_position[i] - before.per_position[i] for i in range(k)),
        gen, prompt, after.clock - before.clock, gen, prompt)


@dataclass(frozen=True)
class Report:
    """One scrape in its series: the figures since the previous scrape and the totals."""

    snapshot: Snapshot
    series: int                 # 1, then one more after each reset
    reset: bool                 # this scrape started a new series (the server restarted)
    interval: Figures | None    # since the previous scrape; None at a series' first scrape
    total: Figures              # the server's counters since it started; tokens/s averaged
                                # over the part of this series that was watched

    def to_dict(self, **head: Any) -> dict[str, Any]:
        s = self.snapshot
        return {**head, "t": round(s.t, 3), "series": self.series, "reset": self.reset,
                "running": _int(s.running), "waiting": _int(s.waiting),
                "kv_cache_usage_pct": None if s.kv_cache_usage is None
                else round(100 * s.kv_cache_usage, 2),
                "interval": self.interval.to_dict() if self.interval else None,
                "total": self.total.to_dict()}


class Series:
    """Consecutive scrapes of one endpoint; a counter reset starts series n+1."""

    def __init__(self) -> None:
        self.number = 0
        self.first: Snapshot | None = None
        self.last: Snapshot | None = None

    def add(self, snap: Snapshot) -> Report:
        reset = self.last is not None and is_reset(self.last, snap)
        if self.last is None or reset:
            self.number += 1
            self.first = snap
            step = None
        else:
            step = interval(self.last, snap)
        self.last = snap
        first = self.first
        assert first is not None
        watched = snap.clock - first.clock
        total = figures(snap.drafts, snap.draft_tokens, snap.accepted, snap.per_position,
                        snap.generation_tokens, snap.prompt_tokens, watched or None,
                        _diff(first.generation_tokens, snap.generation_tokens),
                        _diff(first.prompt_tokens, snap.prompt_tokens))
        return Report(snapshot=snap, series=self.number, reset=reset, interval=step, total=total)


# -- what the logs pane charts --------------------------------------------------------------------

def _stamp(t: float) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(t))


def as_log_records(report: Report) -> tuple[EngineStats, SpecDecodeStats | None]:
    """A scrape as the records vLLM's log lines would give (so the same charts draw both);
    no spec record without an interval with drafts in it."""
    s, f = report.snapshot, report.interval
    engine = EngineStats(
        timestamp=_stamp(s.t), level=None, process=None, engine=None, engines=1,
        prompt_throughput=f.prompt_tokens_per_s if f else None,
        generation_throughput=f.generation_tokens_per_s if f else None,
        running=_int(s.running), waiting=_int(s.waiting),
        kv_cache_usage_pct=None if s.kv_cache_usage is None else 100 * s.kv_cache_usage,
        prefix_cache_hit_rate_pct=None)
    if f is None or not f.drafts:
        return engine, None
    per_s = f.seconds if f.seconds and f.seconds > 0 else None
    spec = SpecDecodeStats(
        timestamp=engine.timestamp, level=None, process=None, engine=None, engines=1,
        mean_acceptance_length=f.acceptance_length, accepted=f.accepted, drafted=f.draft_tokens,
        accepted_throughput=_ratio(f.accepted, per_s), drafted_throughput=_ratio(f.draft_tokens,
                                                                                per_s),
        per_position=f.per_position,
        draft_acceptance_rate_pct=None if f.acceptance_rate is None else 100 * f.acceptance_rate)
    return engine, spec


class MetricsHistory:
    """The scrapes a logs pane charts (bounded), and whether the endpoint is answering."""

    def __init__(self, max_points: int = 1000) -> None:
        self.engine: deque[EngineStats] = deque(maxlen=max_points)
        self.spec: deque[SpecDecodeStats] = deque(maxlen=max_points)
        self.series = Series()
        self.last: Report | None = None
        self.ok_at: float | None = None    # clock of the last good scrape
        self.error: str | None = None      # why the last scrape failed (None: it did not)
        self.version = 0

    def add(self, snap: Snapshot) -> Report:
        report = self.series.add(snap)
        if report.reset:
            self.engine.clear()  # the old series' columns would join the new one's
            self.spec.clear()
        engine, spec = as_log_records(report)
        self.engine.append(engine)
        if spec is not None:
            self.spec.append(spec)
        self.last, self.ok_at, self.error = report, snap.clock, None
        self.version += 1
        return report

    def fail(self, message: str) -> None:
        if message != self.error:
            self.error = message
            self.version += 1

    @property
    def has_data(self) -> bool:
        return bool(self.engine)

    def age(self, clock: float) -> float | None:
        """Seconds since the last good scrape (None: never one)."""
        return None if self.ok_at is None else clock - self.ok_at
