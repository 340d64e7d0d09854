"""`eagle3-console launch PROFILE [--force]`: push what changed, start the run detached.

A run whose command ends within its first SETTLE_S seconds without succeeding (a program that
is not there, a bad option) makes launch exit with the run's code (console/scheduler/
run_status.py EXIT_CODES: 1 failed), naming why: `launch && follow` sees the failure."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from console.hosts.host import HostPool
from console.runs.service import launch, list_runs
from console.scheduler.records import Run
from console.scheduler.run_status import EXIT_CODES, RunStatus, combined_status
from console.settings.config import Config

HELP = "start PROFILE detached on its host(s) (pushes changes first; survives disconnects)"
#: how long after its start a run is watched for an immediate failure
SETTLE_S = 1.0


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("profile", help="a [profiles.*] name from the config")
    p.add_argument("--force", action="store_true",
                   help="start even if this profile already has a running run")
    p.add_argument("--json", action="store_true", help="print the run records as JSON")


async def settle(run: Run, pool: HostPool) -> Run:
    """The run's records once it has run SETTLE_S seconds (or ended sooner)."""
    deadline = time.monotonic() + SETTLE_S
    while run.status == RunStatus.RUNNING and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        hosts = sorted({r.host for r in run.records})
        found = await asyncio.gather(*(list_runs(pool[h], run.id) for h in hosts))
        run = Run(run.id, sorted((r for recs in found for r in recs),
                                 key=lambda r: r.node_rank) or run.records, run.pushes)
    return run


async def run(args: argparse.Namespace, config: Config) -> int:
    pool = HostPool(config)
    try:
        started = await settle(await launch(config, args.profile, pool, force=args.force), pool)
    finally:
        await pool.close()
    status = combined_status([r.status for r in started.records])
    code = EXIT_CODES.get(status, 0)
    if args.json:
        print(json.dumps({"id": started.id, "status": started.status,
                          "records": [r.to_json() for r in started.records]}, indent=2))
        return code
    print(started.id)
    for r in started.records:
        node = f" node {r.node_rank}/{r.nnodes}" if r.nnodes > 1 else ""
        if r.job_id:  # a Slurm job: queued (or already started) on the cluster
            why = f" ({r.reason})" if r.reason else ""
            print(f"  {r.host}: job {r.job_id} {r.status}{why}  {r.run_dir}")
            continue
        exit_ = "" if r.exit_code is None or r.status.active else f", exit {r.exit_code}"
        print(f"  {r.host}{node}: pid {r.pid} {r.status}{exit_}  {r.run_dir}")
    if code:
        why = next((r.failure for r in started.records if r.failure), "")
        print(f"error: run {started.id} {status} at once" + (f": {why}" if why else
              f"; see `eagle3-console follow {started.id}`"), file=sys.stderr)
    return code
