"""`eagle3-console compare [--measure S] [--from FILE ...] [--json] [--forget RUN ...]`: one row
per serving session (`serve`) and weight version, and one per `bench` replay: the drafter, the
weight version the server said, its provenance, k, and what vLLM measured while serving it:
acceptance length, per-position acceptance, generation throughput, how long it was watched.
--forget drops serving runs' records from this workstation's journal (`runs --prune` forgets
runs on a host, not what was measured of them here)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from console.checkpoints.compare import Measurer, Row, table_of
from console.checkpoints.journal import forget, load, sessions
from console.hosts.host import HostPool
from console.runs.service import list_runs
from console.scheduler.run_status import RunStatus
from console.settings.config import Config

HELP = "compare served drafters by vLLM's measured acceptance (serving sessions from `serve`)"
NAME_W = 34   # a drafter's path is cut from the left past this (its folder name stays)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--measure", type=float, metavar="S", default=None,
                   help="first scrape every running session's /metrics twice, S seconds apart")
    p.add_argument("--from", dest="files", action="append", default=[], metavar="FILE",
                   help="also read saved `metrics --json` output (repeatable)")
    p.add_argument("--json", action="store_true", help="one JSON object per row")
    p.add_argument("--forget", nargs="+", metavar="RUN", default=None,
                   help="forget these serving runs: their sessions, swaps and measurements "
                        "(run ids as `compare --json` and `runs HOST` show them)")


async def measure(config: Config, pool: HostPool, seconds: float) -> None:
    measurer = Measurer()
    live = []
    for s in sessions():
        if s.host not in config.hosts:
            continue
        host = await pool.ensure(s.host)
        recs = await list_runs(host, s.run_id)
        if recs and recs[0].status == RunStatus.RUNNING:
            live.append((s, host))
    for i in range(2):
        if i:
            await asyncio.sleep(seconds)
        await asyncio.gather(*(measurer.measure(s, h) for s, h in live))


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def render(rows: list[Row]) -> str:
    if not rows:
        return "no serving sessions yet (start one with `eagle3-console serve` or `v` in the " \
               "Checkpoints pane)"
    names = [r.drafter if len(r.drafter) <= NAME_W else "…" + r.drafter[1 - NAME_W:]
             for r in rows]
    name_w = max(len("DRAFTER"), *map(len, names))
    ver_w = max(len("VERSION"), *(len(r.weight_version or "-") for r in rows))
    prov_w = max(len("PROVENANCE"), *(len(r.provenance or "-") for r in rows))
    head = f"{'DRAFTER':<{name_w}} {'VERSION':<{ver_w}} {'PROVENANCE':<{prov_w}} {'K':>2} " \
           f"{'ACC LEN':>7} {'PER POSITION':<22} {'GEN TOK/S':>9} {'WATCHED':>8}  STARTED"
    lines = [head]
    for r, name in zip(rows, names, strict=True):
        pos = " ".join(f"{p:.2f}" for p in r.per_position[:5]) or "-"
        started = time.strftime("%m-%d %H:%M", time.localtime(r.started)) if r.started else "-"
        lines.append(f"{name:<{name_w}} {r.weight_version or '-':<{ver_w}} "
                     f"{r.provenance or '-':<{prov_w}} {r.k if r.k is not None else '-':>2} "
                     f"{_f(r.acceptance_length, '.2f'):>7} {pos:<22} "
                     f"{_f(r.generation_tokens_per_s, '.1f'):>9} "
                     f"{_f(r.seconds, '.0f') + ' s' if r.seconds else '-':>8}  {started}"
                     + (f"  ({r.error})" if r.error else ""))
        if r.note:
            lines.append(f"  note: {r.note}")
    return "\n".join(lines)


async def run(args: argparse.Namespace, config: Config, pool: HostPool) -> int:
    if args.forget:
        known = {s.run_id for s in sessions()}
        unknown = [r for r in args.forget if r not in known]
        if unknown:
            print(f"error: no serving session recorded for {', '.join(unknown)} (`compare "
                  "--json` lists them)", file=sys.stderr)
            return 1
        n = forget(set(args.forget))
        print(f"forgot {', '.join(args.forget)}: {n} records (the servers and their runs are "
              "untouched)")
        return 0
    if args.measure is not None:
        await measure(config, pool, max(0.0, args.measure))
    journal = load([Path(f) for f in args.files])
    if (said := journal.notice()) is not None:
        print(f"warning: {said}", file=sys.stderr)
    rows = table_of(journal)
    if args.json:
        for r in rows:
            print(json.dumps(r.to_dict()))
    else:
        print(render(rows))
    return 0
