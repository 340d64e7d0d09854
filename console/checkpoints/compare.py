"""Compare drafters by what vLLM measured while serving them (the comparison table's service).

A serving session (console/checkpoints/serve.py, `serving.jsonl`) is one drafter served by one `vllm
serve` run. Each scrape of its `/metrics` (`eagle3-console metrics --json` objects: host, url, t,
series, `total` figures) is kept in `serving-metrics.jsonl` under the run id. A session starts a
fresh server, so the last scrape of its newest series holds the session's own counters: drafts,
accepted tokens, per-position acceptance since the server started, and the generation
throughput over the part the console watched. `eagle3-console metrics HOST --json > FILE` output
can be shown too (`compare --from FILE`): a scrape without a run id belongs to the session that
served its host and URL at its time.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from console.checkpoints.serve import read_sessions
from console.hosts.host import Host
from console.logs.metrics_service import MetricsError, MetricsWatch
from console.settings.config import data_dir


@dataclass(frozen=True)
class Row:
    """One serving session and what vLLM measured during it."""

    run_id: str
    host: str
    drafter: str
    provenance: str             # "RUN@STEP < SOURCE", parts left out when unknown
    k: int | None
    acceptance_length: float | None
    per_position: tuple[float, ...]
    acceptance_rate: float | None
    generation_tokens_per_s: float | None
    drafts: int | None
    seconds: float | None       # how long the console watched (first to last scrape)
    started: float | None
    error: str | None = None    # the last scrape's failure, when it failed
    weight_version: str | None = None  # the drafter swapped in (`swap`), None: as started

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["per_position"] = list(self.per_position)
        return d


def results_path() -> Path:
    return data_dir() / "serving-metrics.jsonl"


def record_scrape(run_id: str, scrape: dict[str, Any]) -> None:
    """Keep one scrape (a `metrics --json` object) under its serving run."""
    p = results_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a", encoding="utf-8") as f:
        f.write(json.dumps({"run_id": run_id, **scrape}, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_scrapes(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Scrape objects from JSON-lines files (missing files and malformed lines skipped)."""
    out: list[dict[str, Any]] = []
    for p in paths:
        try:
            text = Path(p).read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        for line in text.splitlines():
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if isinstance(d, dict) and isinstance(d.get("t"), (int, float)):
                out.append(d)
    return out


def _owner(scrape: dict[str, Any], sessions: Sequence[dict[str, Any]]) -> str | None:
    """The run id a scrape belongs to: its own, else the newest session on its host and URL
    that had started by its time."""
    if scrape.get("run_id"):
        return str(scrape["run_id"])
    best: dict[str, Any] | None = None
    for s in sessions:
        if s.get("host") == scrape.get("host") and s.get("metrics") == scrape.get("url") \
                and float(s.get("started") or 0) <= float(scrape["t"]):
            if best is None or float(s.get("started") or 0) > float(best.get("started") or 0):
                best = s
    return str(best["run_id"]) if best else None


def run_name(path: str) -> str:
    """A training run's name from its output directory: `RUNS/finetune-2026…/out` is
    `finetune-2026…` (the engine's `--out {run_dir}/out`), any other folder its own name."""
    parts = [p for p in str(path).rstrip("/").split("/") if p]
    if len(parts) > 1 and parts[-1] == "out":
        return parts[-2]
    return parts[-1] if parts else ""


def _provenance(prov: dict[str, Any]) -> str:
    """A short cell: RUN@STEP < SOURCE (run name, its step, the drafter it was finetuned from),
    from the inspect summary a session records (console/checkpoints/serve.py)."""
    out = run_name(prov["run"]) if isinstance(prov.get("run"), str) else ""
    if isinstance(prov.get("step"), int):
        out += f"@{prov['step']}"
    ft = prov.get("finetune")
    src = ft.get("path") if isinstance(ft, dict) else None
    if isinstance(src, str) and src:
        out += f"{' ' if out else ''}< {os.path.basename(src.rstrip('/'))}"
    return out


def _key(owner: str, sc: dict[str, Any]) -> tuple[str, str, float]:
    """A row's key: its server (run id), the weight version the scrape saw (swap), and for a
    replay (`bench`) its own time: each replay is a row."""
    return owner, str(sc.get("weight_version") or ""), float(sc["t"]) if sc.get("bench") else 0.0


def rows(sessions: Sequence[dict[str, Any]], scrapes: Sequence[dict[str, Any]]) -> list[Row]:
    """One row per serving session and weight version (and per replay), newest first, with the
    measured figures of its last scrape in its newest series (no figures yet: None)."""
    last: dict[tuple[str, str, float], dict[str, Any]] = {}
    failed: dict[tuple[str, str, float], str] = {}
    for sc in sorted(scrapes, key=lambda d: float(d["t"])):
        owner = _owner(sc, sessions)
        if owner is None:
            continue
        key = _key(owner, sc)
        if sc.get("error"):
            failed[key] = str(sc["error"])
            continue
        failed.pop(key, None)
        prev = last.get(key)
        if prev is None or int(sc.get("series") or 1) >= int(prev.get("series") or 1):
            last[key] = sc
    out = []
    for s in sessions:
        rid = str(s.get("run_id"))
        keys = sorted({k for k in (*last, *failed) if k[0] == rid}) or [(rid, "", 0.0)]
        for key in keys:
            sc = last.get(key) or {}
            total = sc.get("total") or {}
            out.append(Row(
                run_id=rid, host=str(s.get("host", "")),
                drafter=str(sc.get("drafter") or s.get("drafter", "")),
                provenance=_provenance(s.get("provenance") or {}) if not sc.get("drafter")
                or sc.get("drafter") == s.get("drafter") else "",
                k=s.get("k"), acceptance_length=total.get("acceptance_length"),
                per_position=tuple(total.get("per_position") or ()),
                acceptance_rate=total.get("acceptance_rate"),
                generation_tokens_per_s=total.get("generation_tokens_per_s"),
                drafts=total.get("drafts"), seconds=total.get("seconds"),
                started=key[2] or s.get("started"), error=failed.get(key),
                weight_version=key[1] or None))
    return sorted(out, key=lambda r: float(r.started or 0), reverse=True)


class Measurer:
    """Scrapes the serving sessions that are running, through their hosts, and keeps each
    scrape (one MetricsWatch per session, so intervals and restarts are tracked)."""

    def __init__(self) -> None:
        self.watches: dict[str, MetricsWatch] = {}

    async def measure(self, session: dict[str, Any], host: Host) -> dict[str, Any]:
        rid, url = str(session["run_id"]), str(session["metrics"])
        watch = self.watches.get(rid)
        if watch is None:
            watch = self.watches[rid] = MetricsWatch(url)
        head = {"host": session.get("host"), "url": url}
        try:
            scrape = (await watch.poll(host.transport)).to_dict(**head)
        except MetricsError as e:
            scrape = {**head, "t": round(time.time(), 3), "error": e.why}
        record_scrape(rid, scrape)
        return scrape


def table(extra: Sequence[Path] = ()) -> list[Row]:
    """The comparison from what is recorded (and the given `metrics --json` files)."""
    return rows(read_sessions(), read_scrapes([results_path(), *extra]))
