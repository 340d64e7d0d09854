"""This workstation's serving journal: frozen records, written and read only here.

Three JSON-lines files in the data dir: `serving.jsonl` (a Session per `serve`: host, port,
drafter, k...), `serving-swaps.jsonl` (a SwapRecord: a drafter swapped into a session's server)
and `serving-metrics.jsonl` (a Scrape of a session's /metrics, or a BenchRun: one `bench`
replay). `record(rec)` appends a record to its file; the readers parse each line once, so a
line that is damaged, cut, not UTF-8, a duplicate, or holds a field of the wrong type, a NaN or
a huge number is skipped or read as unknown, never a crash: the journal is text any editor, a
full disk or an older console may have left. `load()` reads all three at once and counts what
it skipped per file, for the one-line notice the comparison shows.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from console.settings.config import data_dir

#: longer strings in a line are cut (a path or a message is never this long)
MAX_TEXT = 4096
#: a journal file past this is read from its end only (the newest records count)
MAX_FILE = 64 << 20
#: counters and sizes above this are not vLLM's (a line that says 1e308 tokens is damaged)
MAX_COUNT = 1e15

SESSIONS = "serving.jsonl"
SWAPS = "serving-swaps.jsonl"
RESULTS = "serving-metrics.jsonl"

R = TypeVar("R")


@dataclass(frozen=True)
class Lines:
    """A JSON-lines file read: its JSON objects, oldest first, and how many lines were not."""

    objects: list[dict[str, Any]]
    damaged: int


def read_lines(path: Path) -> Lines:
    """The JSON objects of a JSON-lines file; a missing or unreadable file is empty, a line
    that is not a JSON object is skipped and counted, bytes that are not UTF-8 replaced."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_FILE:
                f.seek(size - MAX_FILE)
            data = f.read(MAX_FILE)
    except OSError:
        return Lines([], 0)
    lines = data.decode("utf-8", errors="replace").splitlines()
    if size > MAX_FILE and lines:
        lines = lines[1:]   # the tail starts inside a line: not a damaged one
    out, damaged = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except (ValueError, RecursionError):
            d = None
        if isinstance(d, dict):
            out.append(d)
        else:
            damaged += 1
    return Lines(out, damaged)


def parsed(path: Path, parse: Callable[[dict[str, Any]], R | None]) -> tuple[list[R], int]:
    """The records of a file, oldest first, and how many lines were skipped (damaged, or not
    such a record)."""
    lines = read_lines(path)
    out = [r for d in lines.objects if (r := parse(d)) is not None]
    return out, lines.damaged + len(lines.objects) - len(out)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One writer at a time across the three files (appends and `forget`'s rewrite): a line
    appended while `forget` rewrites its file would be lost with the old file."""
    data_dir().mkdir(parents=True, exist_ok=True)
    with open(data_dir() / ".serving-journal.lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def record(rec: Record) -> None:
    """Append one record as one line to its file (the only way a record is written)."""
    line = json.dumps(rec.to_json(), sort_keys=True) + "\n"
    with _locked(), open(data_dir() / rec.FILE, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def forget(run_ids: set[str]) -> int:
    """Drop every record of these serving runs (sessions, swaps, scrapes and replays) from the
    three files, each rewritten to a temp file and renamed over; how many lines went. Lines of
    other runs are kept byte for byte, damaged ones included."""
    gone = 0
    with _locked():
        for path in (sessions_path(), swaps_path(), results_path()):
            try:
                lines = path.read_bytes().splitlines(keepends=True)
            except FileNotFoundError:
                continue
            keep = []
            for raw in lines:
                try:
                    d = json.loads(raw)
                except (ValueError, RecursionError):
                    d = None
                if isinstance(d, dict) and d.get("run_id") in run_ids:
                    gone += 1
                else:
                    keep.append(raw)
            if len(keep) == len(lines):
                continue
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            with open(tmp, "wb") as f:
                f.writelines(keep)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    return gone


def text(v: Any) -> str | None:
    return v[:MAX_TEXT] if isinstance(v, str) else None


def number(v: Any, low: float = 0.0, high: float = MAX_COUNT) -> float | None:
    """A finite number within [low, high] (bool is not a number here), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) and low <= f <= high else None


def count(v: Any, low: int = 0) -> int | None:
    f = number(v, low)
    return None if f is None or f != int(f) else int(f)


def _obj(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, dict) else {}


def _path_of(v: Any) -> str | None:
    return text(_obj(v).get("path")) or None


def _dropped_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def run_name(path: str) -> str:
    """A training run's name from its output directory: `RUNS/finetune-2026…/out` is
    `finetune-2026…` (the engine's `--out {run_dir}/out`), any other folder its own name."""
    parts = [p for p in str(path).rstrip("/").split("/") if p]
    if len(parts) > 1 and parts[-1] == "out":
        return parts[-2]
    return parts[-1] if parts else ""


@dataclass(frozen=True)
class Provenance:
    """What the comparison tells drafters apart by, from the provenance `engine inspect`
    reports (engine/inspect_report.py): the run, its step, held-out tau, the finetune source's
    path and what a conversion was made from (their paths, not their per-file digests)."""

    written_by: str | None = None
    run: str | None = None
    step: int | None = None
    held_out_tau: float | None = None
    format: str | None = None
    finetune: str | None = None       # the path of the drafter it was finetuned from
    derived_from: str | None = None   # the path of the drafter it was converted from

    @classmethod
    def parse(cls, v: Any) -> Provenance:
        d = _obj(v)
        return cls(written_by=text(d.get("written_by")), run=text(d.get("run")),
                   step=count(d.get("step")), held_out_tau=number(d.get("held_out_tau"), 0.0),
                   format=text(d.get("format")), finetune=_path_of(d.get("finetune")),
                   derived_from=_path_of(d.get("derived_from")))

    @classmethod
    def of_inspect(cls, report: Mapping[str, Any]) -> Provenance:
        """The provenance of an inspect report's summary (its `provenance` object)."""
        return cls.parse(report.get("provenance"))

    def to_json(self) -> dict[str, Any]:
        return _dropped_none({
            "written_by": self.written_by, "run": self.run, "step": self.step,
            "held_out_tau": self.held_out_tau, "format": self.format,
            "finetune": {"path": self.finetune} if self.finetune else None,
            "derived_from": {"path": self.derived_from} if self.derived_from else None})

    @property
    def cell(self) -> str:
        """A short cell: RUN@STEP < SOURCE (run name, its step, the drafter it was finetuned
        from)."""
        out = run_name(self.run) if self.run else ""
        if self.step is not None:
            out += f"@{self.step}"
        if self.finetune:
            out += f"{' ' if out else ''}< {os.path.basename(self.finetune.rstrip('/'))}"
        return out


# -- serving sessions -----------------------------------------------------------------------------

def sessions_path() -> Path:
    return data_dir() / SESSIONS


@dataclass(frozen=True)
class Session:
    """One `serve`: a vLLM server started on a host with a drafter."""

    FILE: ClassVar[str] = SESSIONS

    run_id: str
    host: str
    drafter: str                # the folder it started with
    verifier: str
    k: int | None
    port: int | None
    metrics: str                # its /metrics URL as seen from the host
    started: float | None
    swappable: bool             # started with the weight-update routes
    provenance: Provenance = Provenance()   # of the drafter it started with
    tp: int | None = None
    format: str | None = None   # the drafter's format, as inspect said
    draft_vocab_size: int | None = None
    extra: tuple[str, ...] = ()  # the words passed through to `vllm serve`

    @property
    def base_url(self) -> str:
        return self.metrics.removesuffix("/metrics") if self.metrics else \
            f"http://127.0.0.1:{self.port}"

    @classmethod
    def parse(cls, d: Mapping[str, Any]) -> Session | None:
        run_id, host = text(d.get("run_id")), text(d.get("host"))
        if not run_id or not host:
            return None
        port = count(d.get("port"), 1)
        port = port if port is not None and port <= 65535 else None
        metrics = text(d.get("metrics")) or (f"http://127.0.0.1:{port}/metrics" if port else "")
        k = count(d.get("k"), 1)
        extra = _obj(d.get("request")).get("extra", d.get("extra"))
        return cls(run_id=run_id, host=host, drafter=text(d.get("drafter")) or "",
                   verifier=text(d.get("verifier")) or "",
                   k=k if k is not None and k <= 64 else None, port=port, metrics=metrics,
                   started=number(d.get("started"), 0.0, 1e11),
                   swappable=d.get("swappable") is True,
                   provenance=Provenance.parse(d.get("provenance")),
                   tp=count(d.get("tp"), 1), format=text(d.get("format")),
                   draft_vocab_size=count(d.get("draft_vocab_size"), 1),
                   extra=tuple(w for w in extra if isinstance(w, str))
                   if isinstance(extra, list) else ())

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "host": self.host, "drafter": self.drafter,
                "verifier": self.verifier, "k": self.k, "tp": self.tp, "port": self.port,
                "metrics": self.metrics, "provenance": self.provenance.to_json(),
                "format": self.format, "draft_vocab_size": self.draft_vocab_size,
                "started": self.started, "swappable": self.swappable,
                "extra": list(self.extra)}


def _sessions(lines: list[Session]) -> list[Session]:
    """A run id recorded twice counts once (its last line)."""
    by: dict[str, Session] = {}
    for s in lines:
        by.pop(s.run_id, None)
        by[s.run_id] = s
    return list(by.values())


def sessions() -> list[Session]:
    """Every recorded serving session, oldest first."""
    return _sessions(parsed(sessions_path(), Session.parse)[0])


# -- swaps ----------------------------------------------------------------------------------------

def swaps_path() -> Path:
    return data_dir() / SWAPS


@dataclass(frozen=True)
class SwapRecord:
    """A drafter this console swapped into a server (the weight version the server then said)."""

    FILE: ClassVar[str] = SWAPS

    run_id: str | None
    host: str
    url: str
    drafter: str
    weight_version: str
    t: float | None
    provenance: Provenance = Provenance()
    previous: str | None = None           # the folder it served before, when known
    previous_version: str | None = None
    seconds: float | None = None          # how long the routes took

    @classmethod
    def parse(cls, d: Mapping[str, Any]) -> SwapRecord | None:
        host, drafter, version = text(d.get("host")), text(d.get("drafter")), \
            text(d.get("weight_version"))
        if not host or not drafter or not version:
            return None
        return cls(run_id=text(d.get("run_id")) or None, host=host,
                   url=(text(d.get("url")) or "").rstrip("/"), drafter=drafter,
                   weight_version=version, provenance=Provenance.parse(d.get("provenance")),
                   t=number(d.get("t"), 0.0, 1e11), previous=text(d.get("previous")),
                   previous_version=text(d.get("previous_version")),
                   seconds=number(d.get("seconds")))

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "host": self.host, "url": self.url,
                "drafter": self.drafter, "weight_version": self.weight_version,
                "previous": self.previous, "previous_version": self.previous_version,
                "seconds": self.seconds, "t": self.t, "provenance": self.provenance.to_json()}


def swaps() -> list[SwapRecord]:
    """Every recorded swap, oldest first."""
    return parsed(swaps_path(), SwapRecord.parse)[0]


def swapped_in(version: str, host: str, records: Iterable[SwapRecord] | None = None
               ) -> SwapRecord | None:
    """The newest swap on `host` that put weight version `version` in a server."""
    found = [s for s in (swaps() if records is None else records)
             if s.weight_version == version and s.host == host]
    return found[-1] if found else None


# -- /metrics scrapes and replays -----------------------------------------------------------------

def results_path() -> Path:
    return data_dir() / RESULTS


@dataclass(frozen=True)
class Figures:
    """What vLLM's counters say over a span (a scrape's `total` or `interval`, a replay's)."""

    drafts: int | None = None
    draft_tokens: int | None = None
    accepted: int | None = None
    acceptance_length: float | None = None
    acceptance_rate: float | None = None
    per_position: tuple[float, ...] = ()
    generation_tokens: int | None = None
    generation_tokens_per_s: float | None = None
    seconds: float | None = None
    prompt_tokens_per_s: float | None = None

    @classmethod
    def parse(cls, v: Any) -> Figures | None:
        if not isinstance(v, dict):
            return None
        pos = v.get("per_position")
        positions = [number(p, 0.0, 1.0) for p in pos] if isinstance(pos, list) else []
        return cls(drafts=count(v.get("drafts")), draft_tokens=count(v.get("draft_tokens")),
                   accepted=count(v.get("accepted")),
                   acceptance_length=number(v.get("acceptance_length"), 1.0, 1000.0),
                   acceptance_rate=number(v.get("acceptance_rate"), 0.0, 1.0),
                   per_position=tuple(p for p in positions if p is not None)
                   if None not in positions and len(positions) <= 64 else (),
                   generation_tokens=count(v.get("generation_tokens")),
                   generation_tokens_per_s=number(v.get("generation_tokens_per_s")),
                   seconds=number(v.get("seconds")),
                   prompt_tokens_per_s=number(v.get("prompt_tokens_per_s")))

    def to_json(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "drafts": self.drafts,
                "draft_tokens": self.draft_tokens, "accepted": self.accepted,
                "acceptance_length": self.acceptance_length,
                "acceptance_rate": self.acceptance_rate,
                "per_position": list(self.per_position),
                "generation_tokens": self.generation_tokens,
                "generation_tokens_per_s": self.generation_tokens_per_s,
                "prompt_tokens_per_s": self.prompt_tokens_per_s}


@dataclass(frozen=True)
class Scrape:
    """One scrape of a session's /metrics (a `metrics --json` object)."""

    FILE: ClassVar[str] = RESULTS
    bench: ClassVar[bool] = False

    run_id: str | None          # None: a saved `metrics --json` line (matched by host, URL)
    host: str
    url: str
    t: float
    series: int = 1
    error: str | None = None
    weight_version: str | None = None  # what the server's /weight_info said (None: not asked)
    drafter: str | None = None  # the folder that version is, when this console knew it
    steady: bool = False        # the version was the same at the previous scrape and after
    total: Figures | None = None
    interval: Figures | None = None
    reset: bool = False         # this scrape started a new series (the server restarted)
    running: int | None = None
    waiting: int | None = None
    kv_cache_usage_pct: float | None = None

    @classmethod
    def parse(cls, d: Mapping[str, Any]) -> Scrape | None:
        t = number(d.get("t"), 0.0, 1e11)
        if t is None or d.get("bench") is True:
            return None
        return cls(run_id=text(d.get("run_id")) or None, host=text(d.get("host")) or "",
                   url=text(d.get("url")) or "", t=t, series=count(d.get("series"), 1) or 1,
                   error=text(d.get("error")),
                   weight_version=text(d.get("weight_version")) or None,
                   drafter=text(d.get("drafter")) or None, steady=d.get("steady") is True,
                   total=Figures.parse(d.get("total")),
                   interval=Figures.parse(d.get("interval")), reset=d.get("reset") is True,
                   running=count(d.get("running")), waiting=count(d.get("waiting")),
                   kv_cache_usage_pct=number(d.get("kv_cache_usage_pct"), 0.0, 100.0))

    def to_json(self) -> dict[str, Any]:
        out = {"run_id": self.run_id, "host": self.host, "url": self.url, "t": self.t,
               "series": self.series, "reset": self.reset, "running": self.running,
               "waiting": self.waiting, "kv_cache_usage_pct": self.kv_cache_usage_pct,
               "interval": self.interval.to_json() if self.interval else None,
               "total": self.total.to_json() if self.total else None}
        if self.error is not None:
            out["error"] = self.error
        if self.weight_version is not None:
            out.update(weight_version=self.weight_version, steady=self.steady,
                       drafter=self.drafter)
        return out


@dataclass(frozen=True)
class SpecCounts:
    """vLLM's per-request acceptance (`metrics.speculative_decoding` of an answer, with
    --per-request-spec-decode-metrics), one answer's or summed over a replay."""

    acceptance_length: float | None
    drafts: int
    accepted: int
    draft_tokens: int
    histogram: tuple[int, ...] | None = None   # accepted drafts per step (one answer's)

    @classmethod
    def parse(cls, v: Any) -> SpecCounts | None:
        d = _obj(v)
        drafts, accepted = count(d.get("drafts")), count(d.get("accepted"))
        tokens = count(d.get("draft_tokens"))
        if drafts is None or accepted is None or tokens is None:
            return None
        hist = d.get("histogram")
        return cls(number(d.get("acceptance_length"), 1.0, 1000.0), drafts, accepted, tokens,
                   tuple(h for h in hist if isinstance(h, int)) if isinstance(hist, list)
                   else None)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"acceptance_length": self.acceptance_length,
                               "drafts": self.drafts, "accepted": self.accepted,
                               "draft_tokens": self.draft_tokens}
        if self.histogram is not None:
            out["histogram"] = list(self.histogram)
        return out


@dataclass(frozen=True)
class BenchRun:
    """One `bench` replay: its own counters (`total`), kept beside the scrapes."""

    FILE: ClassVar[str] = RESULTS
    bench: ClassVar[bool] = True
    #: a replay is one span: the table reads it like a scrape without intervals
    series: ClassVar[int] = 1
    interval: ClassVar[Figures | None] = None
    steady: ClassVar[bool] = False
    error: ClassVar[str | None] = None

    run_id: str | None
    host: str
    url: str
    t: float
    drafter: str | None = None
    weight_version: str | None = None
    records_disagree: str | None = None
    prompts: int | None = None
    max_tokens: int | None = None
    stop: str | None = None             # "eos" or "fixed"
    concurrency: int | None = None
    completion_tokens: int | None = None
    seconds: float | None = None
    generation_tokens_per_s: float | None = None
    latency_median: float | None = None
    latency_max: float | None = None
    total: Figures | None = None
    other_traffic: bool = False         # the counters grew by more than the replay's tokens
    requests_total: SpecCounts | None = None

    @classmethod
    def parse(cls, d: Mapping[str, Any]) -> BenchRun | None:
        t = number(d.get("t"), 0.0, 1e11)
        if t is None or d.get("bench") is not True:
            return None
        lat = _obj(d.get("latency_s"))
        return cls(run_id=text(d.get("run_id")) or None, host=text(d.get("host")) or "",
                   url=text(d.get("url")) or "", t=t, drafter=text(d.get("drafter")) or None,
                   weight_version=text(d.get("weight_version")) or None,
                   records_disagree=text(d.get("records_disagree")),
                   prompts=count(d.get("prompts")), max_tokens=count(d.get("max_tokens")),
                   stop=text(d.get("stop")), concurrency=count(d.get("concurrency")),
                   completion_tokens=count(d.get("completion_tokens")),
                   seconds=number(d.get("seconds")),
                   generation_tokens_per_s=number(d.get("generation_tokens_per_s")),
                   latency_median=number(lat.get("median")), latency_max=number(lat.get("max")),
                   total=Figures.parse(d.get("total")),
                   other_traffic=d.get("other_traffic") is True,
                   requests_total=SpecCounts.parse(d.get("requests_total")))

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "url": self.url, "run_id": self.run_id, "bench": True,
                "drafter": self.drafter, "weight_version": self.weight_version,
                "records_disagree": self.records_disagree, "t": self.t,
                "prompts": self.prompts, "max_tokens": self.max_tokens, "stop": self.stop,
                "concurrency": self.concurrency, "completion_tokens": self.completion_tokens,
                "seconds": self.seconds, "generation_tokens_per_s": self.generation_tokens_per_s,
                "latency_s": {"median": self.latency_median, "max": self.latency_max},
                "total": self.total.to_json() if self.total else None,
                "other_traffic": self.other_traffic,
                "requests_total": self.requests_total.to_json() if self.requests_total
                else None}


Measurement = Scrape | BenchRun
Record = Session | SwapRecord | Scrape | BenchRun


def measurement(d: Mapping[str, Any]) -> Measurement | None:
    """A line of serving-metrics.jsonl (or of saved `metrics --json` output)."""
    return BenchRun.parse(d) if d.get("bench") is True else Scrape.parse(d)


def measurements(path: Path) -> tuple[list[Measurement], int]:
    """The scrapes and replays of a JSON-lines file, and how many lines were skipped."""
    got: tuple[list[Measurement], int] = parsed(path, measurement)
    return got


def scrapes(paths: Iterable[Path]) -> list[Measurement]:
    """The scrapes and replays of JSON-lines files (missing files and damaged lines skipped)."""
    return [m for p in paths for m in measurements(Path(p))[0]]


# -- everything at once, with what was skipped ----------------------------------------------------

@dataclass(frozen=True)
class Journal:
    """The three files (and any saved `metrics --json` files) read at once."""

    sessions: list[Session]
    swaps: list[SwapRecord]
    measurements: list[Measurement]
    skipped: dict[str, int] = field(default_factory=dict)   # file as named: lines skipped

    def notice(self) -> str | None:
        """One line naming each file that had lines the readers could not use (None: none)."""
        said = [f"{name}: {n} damaged line{'s' if n != 1 else ''} skipped"
                for name, n in self.skipped.items() if n]
        return "; ".join(said) or None


def load(extra: Iterable[Path] = ()) -> Journal:
    """Read the journal (and `extra` saved `metrics --json` files)."""
    skipped: dict[str, int] = {}
    found, skipped[SESSIONS] = parsed(sessions_path(), Session.parse)
    swap_list, skipped[SWAPS] = parsed(swaps_path(), SwapRecord.parse)
    measured, skipped[RESULTS] = measurements(results_path())
    for p in extra:
        more, n = measurements(Path(p))
        measured += more
        skipped[str(p)] = skipped.get(str(p), 0) + n
    return Journal(_sessions(found), swap_list, measured, skipped)
