"""`eagle3-console runs HOST [--json] [--prune]`: the run registry on HOST (a training run's best
held-out acceptance length at its step in HELD-OUT, `3.44@150`, as the Runs pane shows it);
--prune forgets the runs that have ended (their records and logs; files they wrote and
running runs stay, nothing is signalled)."""

from __future__ import annotations

import argparse
import json
import time

from console.hosts.host import HostPool
from console.runs.service import list_runs, prune_runs
from console.scheduler.records import PruneReport, RunRecord, newest_first
from console.scheduler.run_status import RunStatus
from console.settings.config import Config

HELP = ("list the runs recorded on HOST (pending, running, succeeded, failed, stopped, lost, "
        "...); --prune forgets the ended ones")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("host", help="a configured host name")
    p.add_argument("--json", action="store_true", help="print the records as JSON")
    p.add_argument("--prune", action="store_true",
                   help="forget the runs that have ended (succeeded, failed, stopped, lost): "
                        "delete their records and logs; files they wrote (out/), running and "
                        "queued runs stay; nothing is signalled")


async def run(args: argparse.Namespace, config: Config) -> int:
    pool = HostPool(config)
    host = await pool.ensure(args.host)
    try:
        if args.prune:
            report = await prune_runs(host)
        else:
            records = newest_first(await list_runs(host))   # the runs pane's order
    finally:
        await pool.close()
    if args.prune:
        return _print_prune(report, args.json)
    if args.json:
        print(json.dumps([r.to_json() for r in records], indent=2))
        return 0
    if not records:
        print(f"no runs on {args.host}")
        return 0
    # ids and profile names are handles (follow, stop, launch): never cut; each column is as
    # wide as its longest, so the columns after it stay in line
    w = max(40, *(len(r.id) for r in records))
    pw = max(16, *(len(r.profile) for r in records))
    print(f"{'RUN':<{w}} {'PROFILE':<{pw}} {'STATUS':<10} {'EXIT':>5} {'HELD-OUT':<10} "
          f"{'STARTED':<19} ELAPSED")
    for r in records:
        if r.status == RunStatus.CORRUPT:  # nothing in it can be trusted but the reason
            print(f"{r.id:<{w}} {r.profile:<{pw}} {r.status:<10} {r.error}")
            continue
        print(f"{r.id:<{w}} {r.profile:<{pw}} {r.status:<10} {_exit(r):>5} "
              f"{r.best_cell():<10} "
              f"{_when(r.start):<19} "
              f"{_duration(r)}" + (f"  node {r.node_rank}/{r.nnodes}" if r.nnodes > 1 else "")
              + _job(r))
    return 0


def _print_prune(report: PruneReport, as_json: bool) -> int:
    if as_json:
        print(json.dumps({"host": report.host, "removed": report.removed,
                          "kept": [{"id": i, "why": w} for i, w in report.kept],
                          "left": [{"id": i, "files": f} for i, f in report.left]}, indent=2))
        return 0
    n = len(report.removed)
    print(f"forgot {n} ended run{'' if n == 1 else 's'} on {report.host}"
          + (": " + ", ".join(report.removed) if report.removed else ""))
    for rid, why in report.kept:
        print(f"kept {rid}: {why}")
    for rid, files in report.left:
        print(f"left {rid}/ with {', '.join(files)}: not written by the console")
    return 0


def _job(r: RunRecord) -> str:
    """A Slurm run's job id, partition, nodes and the scheduler's reason ("" elsewhere)."""
    if not r.job_id:
        return ""
    part = r.partition
    where = r.nodelist
    return (f"  job {r.job_id}" + (f" {part}" if part else "") + (f" {where}" if where else "")
            + (f" ({r.reason})" if r.reason else ""))


def _exit(r: RunRecord) -> str:
    return "" if r.exit_code is None else str(r.exit_code)


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _duration(r: RunRecord) -> str:
    if not r.start:
        return "-"
    secs = int((r.end or time.time()) - r.start)
    h, rem = divmod(secs, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}"
