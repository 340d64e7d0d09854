"""`eagle3-console compare [--measure S] [--from FILE ...] [--json]`: one row per serving session
(`serve`): the drafter, its provenance, k, and what vLLM measured while serving it: acceptance
length, per-position acceptance, generation throughput, how long it was watched."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from console.checkpoints.compare import Measurer, Row, table
from console.checkpoints.serve import read_sessions
from console.hosts.host import HostPool
from console.runs.service import list_runs
from console.scheduler.run_status import RunStatus
from console.settings.config import Config

HELP = "compare served drafters by vLLM's measured acceptance (serving sessions from `serve`)"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--measure", type=float, metavar="S", default=None,
                   help="first scrape every running session's /metrics twice, S seconds apart")
    p.add_argument("--from", dest="files", action="append", default=[], metavar="FILE",
                   help="also read saved `metrics --json` output (repeatable)")
    p.add_argument("--json", action="store_true", help="one JSON object per row")


async def measure(config: Config, seconds: float) -> None:
    pool = HostPool(config)
    measurer = Measurer()
    try:
        live = []
        for s in read_sessions():
            if s.get("host") not in config.hosts:
                continue
            host = await pool.ensure(str(s["host"]))
            recs = await list_runs(host, str(s["run_id"]))
            if recs and recs[0].status == RunStatus.RUNNING:
                live.append((s, host))
        for i in range(2):
            if i:
                await asyncio.sleep(seconds)
            await asyncio.gather(*(measurer.measure(s, h) for s, h in live))
    finally:
        await pool.close()


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def render(rows: list[Row]) -> str:
    if not rows:
        return "no serving sessions yet (start one with `eagle3-console serve` or `v` in the " \
               "Checkpoints pane)"
    head = f"{'DRAFTER':<34} {'PROVENANCE':<28} {'K':>2} {'ACC LEN':>7} {'PER POSITION':<22} " \
           f"{'GEN TOK/S':>9} {'WATCHED':>8}  STARTED"
    lines = [head]
    for r in rows:
        pos = " ".join(f"{p:.2f}" for p in r.per_position[:5]) or "-"
        started = time.strftime("%m-%d %H:%M", time.localtime(r.started)) if r.started else "-"
        name = r.drafter if len(r.drafter) <= 34 else "…" + r.drafter[-33:]
        lines.append(f"{name:<34} {r.provenance[:28]:<28} {r.k if r.k is not None else '-':>2} "
                     f"{_f(r.acceptance_length, '.2f'):>7} {pos:<22} "
                     f"{_f(r.generation_tokens_per_s, '.1f'):>9} "
                     f"{_f(r.seconds, '.0f') + ' s' if r.seconds else '-':>8}  {started}"
                     + (f"  ({r.error})" if r.error else ""))
    return "\n".join(lines)


async def run(args: argparse.Namespace, config: Config) -> int:
    if args.measure is not None:
        await measure(config, max(0.0, args.measure))
    rows = table([Path(f) for f in args.files])
    if args.json:
        for r in rows:
            print(json.dumps(r.to_dict()))
    else:
        print(render(rows))
    return 0
