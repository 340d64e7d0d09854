"""`eagle3-console runs HOST [--json] [--wide] [--prune]`: the run registry on HOST (a training
run's best held-out acceptance length at its step in HELD-OUT, `3.44@150`, as the Runs pane
shows it; long run ids cut in the middle to fit 100 columns, whole with --wide); --prune
forgets the runs that have ended (their records and logs; files they wrote and running runs
stay, nothing is signalled)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from console.hosts.host import HostPool
from console.runs.service import list_runs, prune_runs
from console.scheduler.launch import fit_id
from console.scheduler.registry import PruneReport, newest_first
from console.scheduler.run_record import RunRecord
from console.scheduler.run_status import RunStatus
from console.settings.config import Config

HELP = ("list the runs recorded on HOST (pending, running, succeeded, failed, stopped, lost, "
        "...); --prune forgets the ended ones")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("host", help="a configured host name")
    p.add_argument("--json", action="store_true", help="print the records as JSON")
    p.add_argument("--wide", action="store_true",
                   help="print run ids and profile names whole (they are cut to fit 100 columns)")
    p.add_argument("--prune", action="store_true",
                   help="forget the runs that have ended (succeeded, failed, stopped, lost): "
                        "delete their records and logs; files they wrote (out/), running and "
                        "queued runs stay; nothing is signalled")


async def run(args: argparse.Namespace, config: Config, pool: HostPool) -> int:
    host = await pool.ensure(args.host)
    if args.prune:
        report = await prune_runs(host)
    else:
        records = newest_first(await list_runs(host))   # the runs pane's order
    if args.prune:
        return _print_prune(report, args.json)
    if args.json:
        print(json.dumps([r.to_json() for r in records], indent=2))
        return 0
    if not records:
        print(f"no runs on {args.host}")
        return 0
    print_table(records, wide=args.wide)
    return 0


#: the widest RUN and PROFILE cells (with --wide: no limit): every column up to ELAPSED fits
#: 100 columns; a `finetune-YYYYMMDD-HHMMSS-xxxx` id (29) is whole, a serve run's is cut in the
#: middle, keeping the time and suffix that tell runs apart (--json and --wide: whole)
RUN_MAX = 32
PROFILE_MAX = 16
REASON_MAX = 60


def print_table(records: list[RunRecord], wide: bool = False) -> None:
    """The table, each column as wide as its longest cell (up to its limit), so the columns
    after it stay in line; a note on stderr when ids were cut."""
    w = max(len("RUN"), *(len(r.id) for r in records))
    pw = max(len("PROFILE"), *(len(r.profile) for r in records))
    if not wide:
        w, pw = min(w, RUN_MAX), min(pw, PROFILE_MAX)
    print(f"{'RUN':<{w}} {'PROFILE':<{pw}} {'STATUS':<9} {'EXIT':>4} {'HELD-OUT':<9} "
          f"{'STARTED':<16} ELAPSED")
    for r in records:
        rid, profile = fit_id(r.id, w), _cut(r.profile, pw)
        if r.status == RunStatus.CORRUPT:  # nothing in it can be trusted but the reason
            print(f"{rid:<{w}} {profile:<{pw}} {r.status:<9} "
                  f"{r.error if wide else _cut(r.error, REASON_MAX)}")
            continue
        print(f"{rid:<{w}} {profile:<{pw}} {r.status:<9} {_exit(r):>4} "
              f"{r.best_cell():<9} {_when(r.start):<16} "
              f"{_duration(r)}" + (f"  node {r.node_rank}/{r.nnodes}" if r.nnodes > 1 else "")
              + _job(r))
    if any(len(r.id) > w for r in records):
        print(f"(run ids longer than {w} columns are cut in the middle; `--wide` or `--json` "
              "shows them whole)", file=sys.stderr)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


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
        print(f"left {rid}/ in place: it holds {', '.join(files)}, which the console did not "
              "write")
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
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "-"


def _duration(r: RunRecord) -> str:
    """Running time over every attempt (a resumed run's earlier ones too)."""
    total = r.elapsed(time.time())
    if total is None:
        return "-"
    secs = int(total)
    h, rem = divmod(secs, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}"
