"""Compare drafters by what vLLM measured while serving them (the comparison table's service).

A serving session (console/checkpoints/serve.py) is one `vllm serve` run; the journal
(console/checkpoints/journal.py) keeps each scrape of its `/metrics` (`eagle3-console metrics
--json` objects: host, url, t, series, the `interval` since the previous scrape and the `total`
since the server started) and each `bench` replay under the session's run id. A row is one
session and weight version, or one replay:

- A server that only ever served the drafter it started with (weight version `default`, or a
  server without the weight routes) is measured by the last scrape's totals: its counters since
  it started are all that drafter's.
- A server whose drafter was swapped (`swap`, another console, a training run's
  `--eval-server`) has counters that mix drafters. Each scrape asks `/weight_info` before and
  after, so a row of version V adds up only the intervals that began and ended under V (an
  interval a swap fell in belongs to no row).
- A replay (`bench`) is its own row: the counters of exactly that replay.

The drafter a row names is what the server's weight version says: `default` is the drafter the
session started with, another version the folder this console swapped in with that version; a
version no record here names (swapped in by someone else) is shown as the version, and a
record that disagrees with the server is flagged in the row's note. `metrics HOST --json > FILE`
output can be shown too (`compare --from FILE`): a scrape without a run id belongs to the
session that served its host and URL at its time.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from console.checkpoints.journal import (
    Figures,
    Journal,
    Measurement,
    Scrape,
    Session,
    SwapRecord,
    load,
    record,
    scrapes,
    swapped_in,
)
from console.checkpoints.live import DEFAULT, weight_info
from console.hosts.host import Host
from console.logs.metrics_service import MetricsError, MetricsWatch
from console.logs.vllm_metrics import Report
from console.transport.http_client import HttpError

_STEP = re.compile(r"^step_0*(\d+)$")


@dataclass(frozen=True)
class Row:
    """One serving session and weight version (or one replay) and what vLLM measured."""

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
    weight_version: str | None = None  # what /weight_info said (None: not asked)
    note: str | None = None     # what is uncertain about the row, or a record that disagrees

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["per_position"] = list(self.per_position)
        return d


def read_scrapes(paths: Iterable[Path]) -> list[Measurement]:
    """Scrapes and replays from JSON-lines files (missing files and damaged lines skipped)."""
    return scrapes(paths)


def path_provenance(folder: str) -> str:
    """RUN@STEP for a trainer checkpoint or an `--eval-server` export by its place
    (RUN/out/checkpoints/step_N, RUN/served/step_N), else nothing."""
    parts = [p for p in folder.rstrip("/").split("/") if p]
    m = _STEP.match(parts[-1]) if parts else None
    if m is None or len(parts) < 3 or parts[-2] not in ("checkpoints", "served"):
        return ""
    run = parts[-4] if parts[-2] == "checkpoints" and parts[-3] == "out" and len(parts) > 3 \
        else parts[-3]
    return f"{run}@{int(m.group(1))}"


def _owner(sc: Measurement, by_host_url: Sequence[Session]) -> str | None:
    """The run id a scrape belongs to: its own, else the newest session on its host and URL
    that had started by its time."""
    if sc.run_id:
        return sc.run_id
    best: Session | None = None
    for s in by_host_url:
        if s.host == sc.host and s.metrics == sc.url and (s.started or 0.0) <= sc.t \
                and (best is None or (s.started or 0.0) > (best.started or 0.0)):
            best = s
    return best.run_id if best else None


def summed(intervals: Sequence[Measurement], swapped_at: Sequence[float] = ()) -> Figures | None:
    """The figures of the intervals that do not overlap (two consoles scraping at once count
    each span once) and in which no recorded swap fell (a swap there and back leaves the same
    version on both sides), added up."""
    drafts = accepted = draft_tokens = gen = 0
    seconds = 0.0
    pos: list[float] = []
    end = 0.0
    for sc in intervals:
        f = sc.interval
        if f is None or f.seconds is None or f.drafts is None or f.accepted is None:
            continue
        if sc.t - f.seconds < end - 1e-3 or any(sc.t - f.seconds <= t <= sc.t
                                                 for t in swapped_at):
            continue
        end = sc.t
        drafts, accepted, seconds = drafts + f.drafts, accepted + f.accepted, seconds + f.seconds
        draft_tokens += f.draft_tokens or 0
        gen += f.generation_tokens or 0
        for i, p in enumerate(f.per_position):
            pos += [0.0] * (i + 1 - len(pos))
            pos[i] += p * f.drafts
    if not seconds:
        return None
    return Figures(drafts=drafts, draft_tokens=draft_tokens, accepted=accepted,
                   acceptance_length=1 + accepted / drafts if drafts else None,
                   acceptance_rate=accepted / draft_tokens if draft_tokens else None,
                   per_position=tuple(p / drafts for p in pos) if drafts else (),
                   generation_tokens=gen, generation_tokens_per_s=gen / seconds,
                   seconds=seconds)


def _newest_total(group: Sequence[Measurement]) -> Figures | None:
    """The last scrape's totals in the newest series (a restart starts a new one)."""
    best: Measurement | None = None
    for sc in group:
        if sc.error is None and (best is None or sc.series >= best.series):
            best = sc
    return best.total if best else None


def _named(s: Session, version: str, group: Sequence[Measurement],
           records: Sequence[SwapRecord]) -> tuple[str, str, str | None]:
    """(drafter, provenance, note) for a row of weight version `version` (module docstring)."""
    said = next((sc.drafter for sc in reversed(group) if sc.drafter), None)
    if version in ("", DEFAULT):
        drafter, prov = (said or s.drafter) if not version else s.drafter, s.provenance.cell
        if drafter != s.drafter:
            rec = next((r for r in reversed(records) if r.drafter == drafter), None)
            prov = rec.provenance.cell if rec else path_provenance(drafter)
        note = None if not said or said == drafter else \
            f"recorded as {said}; the server's weight version {version} is {drafter}"
        return drafter, prov or path_provenance(drafter), note
    if version.startswith("unknown: "):
        return "", "", "a swap ended without an answer: which drafter served is not known"
    rec = swapped_in(version, s.host, records)
    if rec is None:
        return "", path_provenance(said or ""), \
            f"weight version {version} was not swapped in by this console (another console, " \
            "or a training run's --eval-server)" + (f"; recorded as {said}" if said else "")
    note = None if not said or said == rec.drafter else \
        f"recorded as {said}; the server's weight version {version} is {rec.drafter}"
    return rec.drafter, rec.provenance.cell or path_provenance(rec.drafter), note


def rows(session_list: Sequence[Session], scrape_list: Sequence[Measurement],
         records: Sequence[SwapRecord] = ()) -> list[Row]:
    """One row per serving session and weight version (and per replay), newest first."""
    by_run = {s.run_id: s for s in session_list}
    groups: dict[tuple[str, str, float], list[Measurement]] = defaultdict(list)
    versions: dict[str, set[str]] = defaultdict(set)   # what each server's measured scrapes saw
    for sc in sorted(scrape_list, key=lambda d: d.t):
        owner = _owner(sc, session_list)
        if owner is None or owner not in by_run:
            continue
        version = sc.weight_version or ""
        groups[owner, version, sc.t if sc.bench else 0.0].append(sc)
        if not sc.bench and version:
            versions[owner].add(version)
    out = []
    for s in session_list:
        keys = sorted(k for k in groups if k[0] == s.run_id) or [(s.run_id, "", 0.0)]
        for key in keys:
            group = groups[key]
            version, replay = key[1], key[2]
            swapped = versions[s.run_id] - {version}
            if replay or not version or version == DEFAULT and not swapped:
                fig = _newest_total(group)
            else:
                fig = summed([sc for sc in group if sc.steady],
                             [r.t for r in records if r.run_id == s.run_id and r.t])
            drafter, prov, note = _named(s, version, group, records)
            last = group[-1] if group else None
            started = replay or (s.started if version in ("", DEFAULT) or not group
                                 else group[0].t)
            f = fig or Figures()
            out.append(Row(
                run_id=s.run_id, host=s.host, drafter=drafter or version, provenance=prov,
                k=s.k, acceptance_length=f.acceptance_length, per_position=f.per_position,
                acceptance_rate=f.acceptance_rate,
                generation_tokens_per_s=f.generation_tokens_per_s, drafts=f.drafts,
                seconds=f.seconds, started=started,
                error=last.error if last is not None else None,
                weight_version=version or None, note=note))
    return sorted(out, key=lambda r: r.started or 0.0, reverse=True)


class Measurer:
    """Scrapes the serving sessions that are running, through their hosts, and keeps each
    scrape (one MetricsWatch per session, so intervals and restarts are tracked), with the
    weight version the server said around it."""

    def __init__(self) -> None:
        self.watches: dict[str, MetricsWatch] = {}
        self.versions: dict[str, str | None] = {}   # the version at each session's last scrape

    async def _version(self, host: Host, s: Session) -> str | None:
        if not s.swappable:
            return None
        try:
            return await weight_info(host, s.base_url)
        except HttpError:
            return None

    async def measure(self, session: Session, host: Host) -> Scrape:
        rid = session.run_id
        if rid not in self.watches:
            self.watches[rid] = MetricsWatch(session.metrics)
        watch = self.watches[rid]
        before = await self._version(host, session)
        try:
            rep = await watch.poll(host.transport)
        except MetricsError as e:
            sc = Scrape(run_id=rid, host=session.host, url=session.metrics,
                        t=round(time.time(), 3), error=e.why)
            self.versions[rid] = None
        else:
            sc = scrape_of(rid, session, rep)
            after = await self._version(host, session) if before is not None else None
            if after is not None:
                steady = before == after and rid in self.versions \
                    and self.versions[rid] == after
                self.versions[rid] = after if before == after else None
                rec = None if after == DEFAULT else swapped_in(after, session.host)
                sc = replace(sc, weight_version=after, steady=steady,
                             drafter=session.drafter if after == DEFAULT
                             else rec.drafter if rec else None)
        record(sc)
        return sc


def scrape_of(run_id: str, session: Session, rep: Report) -> Scrape:
    """The journal's record of one scrape in its series (as `metrics --json` prints it)."""
    sc = Scrape.parse({"run_id": run_id, **rep.to_dict(host=session.host, url=session.metrics)})
    assert sc is not None   # a scrape always has its time
    return sc


def table_of(j: Journal) -> list[Row]:
    return rows(j.sessions, j.measurements, j.swaps)


def table(extra: Sequence[Path] = ()) -> list[Row]:
    """The comparison from what is recorded (and the given `metrics --json` files)."""
    return table_of(load(extra))
