"""`eagle3-console launch PROFILE [--force]`: push what changed, start the run detached.
A pipeline profile starts its store, producer and trainer under one id
(console/scheduler/pipeline.py); launch prints each part's record.
`eagle3-console launch [HOST] --resume RUN`: start a stopped, failed or lost `engine train` run
again in its own run directory, with `--resume` (console/runs/service.py resume_run).

A run whose command ends within its first SETTLE_S seconds without succeeding (a program that
is not there, a bad option) makes launch exit with the run's code (console/scheduler/
run_status.py EXIT_CODES: 1 failed), naming why: `launch && follow` sees the failure."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from console.errors import ConsoleError
from console.hosts.host import HostPool
from console.runs.service import launch, list_runs, resume_run
from console.scheduler.registry import Run
from console.scheduler.run_status import EXIT_CODES, RunStatus, combined_status
from console.settings.config import Config

HELP = "start PROFILE detached on its host(s) (pushes changes first; survives disconnects)"
#: how long after its start a run is watched for an immediate failure
SETTLE_S = 1.0


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("profile", nargs="?", metavar="PROFILE | HOST",
                   help="a [profiles.*] name from the config; with --resume, the host that "
                        "holds the run (optional)")
    p.add_argument("--resume", metavar="RUN",
                   help="start this stopped, failed or lost run again in its own run directory "
                        "with its command's --resume (engine train)")
    p.add_argument("--force", action="store_true",
                   help="start even if this profile already has a running run")
    p.add_argument("--json", action="store_true", help="print the run records as JSON")


async def settle(run: Run, pool: HostPool) -> Run:
    """The run's records once it has run SETTLE_S seconds (or ended sooner)."""
    deadline = time.monotonic() + SETTLE_S
    while run.status == RunStatus.RUNNING and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        # by each record's own id (a pipeline's parts are runs of their own), in their order
        keys = list(dict.fromkeys((r.host, r.id) for r in run.records))
        order = {rid: i for i, rid in enumerate(dict.fromkeys(r.id for r in run.records))}
        found = await asyncio.gather(*(list_runs(pool[h], rid) for h, rid in keys))
        run = Run(run.id, sorted((r for recs in found for r in recs),
                                 key=lambda r: (order.get(r.id, 0), r.node_rank))
                  or run.records, run.pushes)
    return run


async def run(args: argparse.Namespace, config: Config, pool: HostPool) -> int:
    if args.resume is None and args.profile is None:
        raise ConsoleError("launch: name a profile (or --resume RUN)")
    if args.resume is not None and args.profile is not None and \
            args.profile not in config.hosts:
        raise ConsoleError(f"launch --resume: {args.profile!r} is not a configured host "
                           f"({', '.join(config.hosts)})")
    if args.resume is not None:
        begun = await resume_run(config, args.resume, pool, host=args.profile,
                                 force=args.force)
    else:
        begun = await launch(config, args.profile, pool, force=args.force)
    started = await settle(begun, pool)
    status = combined_status([r.status for r in started.records])
    code = EXIT_CODES.get(status, 0)
    if args.json:
        print(json.dumps({"id": started.id, "status": started.status,
                          "records": [r.to_json() for r in started.records]}, indent=2))
        return code
    print(started.id)
    for r in started.records:
        node = (f" {r.part}" if r.part else "") + \
            (f" node {r.node_rank}/{r.nnodes}" if r.nnodes > 1 else "")
        if r.job_id:  # a Slurm job: queued (or already started) on the cluster
            why = f" ({r.reason})" if r.reason else ""
            print(f"  {r.host}{node}: job {r.job_id} {r.status}{why}  {r.run_dir}")
            continue
        exit_ = "" if r.exit_code is None or r.status.active else f", exit {r.exit_code}"
        print(f"  {r.host}{node}: pid {r.pid} {r.status}{exit_}  {r.run_dir}")
    if code:
        why = next((r.failure for r in started.records if r.failure), "")
        print(f"error: run {started.id} {status} at once" + (f": {why}" if why else
              f"; see `eagle3-console follow {started.id}`"), file=sys.stderr)
    return code
