"""This workstation's serving journal, parsed once into frozen records.

Three JSON-lines files in the data dir: `serving.jsonl` (a session per `serve`: host, port,
drafter, k...; written by console/checkpoints/serve.py), `serving-swaps.jsonl` (a drafter swapped
into a session's server; console/checkpoints/swap.py) and `serving-metrics.jsonl` (a scrape of a
session's /metrics, or a `bench` replay; console/checkpoints/compare.py). Every reader of the
journal goes through the parsers here, so a line that is damaged, cut, not UTF-8, a duplicate,
or holds a field of the wrong type, a NaN or a huge number is skipped or read as unknown,
never a crash: the journal is text any editor, a full disk or an older console may have left.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from console.settings.config import data_dir

#: longer strings in a line are cut (a path or a message is never this long)
MAX_TEXT = 4096
#: a journal file past this is read from its end only (the newest records count)
MAX_FILE = 64 << 20
#: counters and sizes above this are not vLLM's (a line that says 1e308 tokens is damaged)
MAX_COUNT = 1e15


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, oldest first; a missing or unreadable file is
    empty, a line that is not a JSON object is skipped, bytes that are not UTF-8 replaced."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_FILE:
                f.seek(size - MAX_FILE)
            data = f.read(MAX_FILE)
    except OSError:
        return []
    out = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        try:
            d = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(d, dict):
            out.append(d)
    return out


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One writer at a time across the three files (appends and `forget`'s rewrite): a line
    appended while `forget` rewrites its file would be lost with the old file."""
    data_dir().mkdir(parents=True, exist_ok=True)
    with open(data_dir() / ".serving-journal.lock", "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def append(path: Path, entry: dict[str, Any]) -> None:
    """Add one record as one line (the only way a record is written)."""
    line = json.dumps(entry, sort_keys=True) + "\n"
    with _locked(), open(path, "a", encoding="utf-8") as f:
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


def run_name(path: str) -> str:
    """A training run's name from its output directory: `RUNS/finetune-2026…/out` is
    `finetune-2026…` (the engine's `--out {run_dir}/out`), any other folder its own name."""
    parts = [p for p in str(path).rstrip("/").split("/") if p]
    if len(parts) > 1 and parts[-1] == "out":
        return parts[-2]
    return parts[-1] if parts else ""


def provenance_cell(prov: Any) -> str:
    """A short cell: RUN@STEP < SOURCE (run name, its step, the drafter it was finetuned from),
    from the inspect summary `serve` and `swap` record (console/checkpoints/serve.py
    session_provenance)."""
    if not isinstance(prov, dict):
        return ""
    run = text(prov.get("run"))
    out = run_name(run) if run else ""
    step = count(prov.get("step"))
    if step is not None:
        out += f"@{step}"
    ft = prov.get("finetune")
    src = text(ft.get("path")) if isinstance(ft, dict) else None
    if src:
        out += f"{' ' if out else ''}< {os.path.basename(src.rstrip('/'))}"
    return out


# -- serving sessions -----------------------------------------------------------------------------

def sessions_path() -> Path:
    return data_dir() / "serving.jsonl"


@dataclass(frozen=True)
class Session:
    """One `serve`: a vLLM server started on a host with a drafter."""

    run_id: str
    host: str
    drafter: str                # the folder it started with
    verifier: str
    k: int | None
    port: int | None
    metrics: str                # its /metrics URL as seen from the host
    started: float | None
    swappable: bool             # started with the weight-update routes
    provenance: str             # provenance_cell of the drafter it started with

    @property
    def base_url(self) -> str:
        return self.metrics.removesuffix("/metrics") if self.metrics else \
            f"http://127.0.0.1:{self.port}"

    @classmethod
    def parse(cls, d: dict[str, Any]) -> Session | None:
        run_id, host = text(d.get("run_id")), text(d.get("host"))
        if not run_id or not host:
            return None
        port = count(d.get("port"), 1)
        port = port if port is not None and port <= 65535 else None
        metrics = text(d.get("metrics")) or (f"http://127.0.0.1:{port}/metrics" if port else "")
        k = count(d.get("k"), 1)
        return cls(run_id=run_id, host=host, drafter=text(d.get("drafter")) or "",
                   verifier=text(d.get("verifier")) or "",
                   k=k if k is not None and k <= 64 else None, port=port, metrics=metrics,
                   started=number(d.get("started"), 0.0, 1e11),
                   swappable=d.get("swappable") is True,
                   provenance=provenance_cell(d.get("provenance")))


def sessions() -> list[Session]:
    """Every recorded serving session, oldest first; a run id recorded twice counts once (its
    last line)."""
    by: dict[str, Session] = {}
    for d in read_lines(sessions_path()):
        s = Session.parse(d)
        if s is not None:
            by.pop(s.run_id, None)
            by[s.run_id] = s
    return list(by.values())


# -- swaps ----------------------------------------------------------------------------------------

def swaps_path() -> Path:
    return data_dir() / "serving-swaps.jsonl"


@dataclass(frozen=True)
class SwapRecord:
    """A drafter this console swapped into a server (the weight version the server then said)."""

    run_id: str | None
    host: str
    url: str
    drafter: str
    weight_version: str
    provenance: str
    t: float | None

    @classmethod
    def parse(cls, d: dict[str, Any]) -> SwapRecord | None:
        host, drafter, version = text(d.get("host")), text(d.get("drafter")), \
            text(d.get("weight_version"))
        if not host or not drafter or not version:
            return None
        return cls(run_id=text(d.get("run_id")) or None, host=host,
                   url=(text(d.get("url")) or "").rstrip("/"), drafter=drafter,
                   weight_version=version, provenance=provenance_cell(d.get("provenance")),
                   t=number(d.get("t"), 0.0, 1e11))


def swaps() -> list[SwapRecord]:
    """Every recorded swap, oldest first."""
    return [s for d in read_lines(swaps_path()) if (s := SwapRecord.parse(d)) is not None]


def swapped_in(version: str, host: str, records: Iterable[SwapRecord] | None = None
               ) -> SwapRecord | None:
    """The newest swap on `host` that put weight version `version` in a server."""
    found = [s for s in (swaps() if records is None else records)
             if s.weight_version == version and s.host == host]
    return found[-1] if found else None


# -- /metrics scrapes and replays -----------------------------------------------------------------

def results_path() -> Path:
    return data_dir() / "serving-metrics.jsonl"


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

    @classmethod
    def parse(cls, d: Any) -> Figures | None:
        if not isinstance(d, dict):
            return None
        pos = d.get("per_position")
        positions = [number(p, 0.0, 1.0) for p in pos] if isinstance(pos, list) else []
        return cls(drafts=count(d.get("drafts")), draft_tokens=count(d.get("draft_tokens")),
                   accepted=count(d.get("accepted")),
                   acceptance_length=number(d.get("acceptance_length"), 1.0, 1000.0),
                   acceptance_rate=number(d.get("acceptance_rate"), 0.0, 1.0),
                   per_position=tuple(p for p in positions if p is not None)
                   if None not in positions and len(positions) <= 64 else (),
                   generation_tokens=count(d.get("generation_tokens")),
                   generation_tokens_per_s=number(d.get("generation_tokens_per_s")),
                   seconds=number(d.get("seconds")))


@dataclass(frozen=True)
class Scrape:
    """One scrape of a session's /metrics (or one `bench` replay, `bench` true)."""

    run_id: str | None          # None: a saved `metrics --json` line (matched by host, URL)
    host: str
    url: str
    t: float
    series: int
    error: str | None
    bench: bool
    weight_version: str | None  # what the server's /weight_info said (None: not asked)
    drafter: str | None         # the folder that version is, when this console knew it
    steady: bool                # the version was the same at the previous scrape and after
    total: Figures | None
    interval: Figures | None

    @classmethod
    def parse(cls, d: dict[str, Any]) -> Scrape | None:
        t = number(d.get("t"), 0.0, 1e11)
        if t is None:
            return None
        return cls(run_id=text(d.get("run_id")) or None, host=text(d.get("host")) or "",
                   url=text(d.get("url")) or "", t=t, series=count(d.get("series"), 1) or 1,
                   error=text(d.get("error")), bench=d.get("bench") is True,
                   weight_version=text(d.get("weight_version")) or None,
                   drafter=text(d.get("drafter")) or None, steady=d.get("steady") is True,
                   total=Figures.parse(d.get("total")),
                   interval=Figures.parse(d.get("interval")))


def scrapes(paths: Iterable[Path]) -> list[Scrape]:
    """The scrapes of JSON-lines files (missing files and damaged lines skipped)."""
    return [s for p in paths for d in read_lines(Path(p)) if (s := Scrape.parse(d)) is not None]
