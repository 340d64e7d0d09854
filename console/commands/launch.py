"""`eagle3-console launch PROFILE [--force]`: push what changed, start the run detached."""

from __future__ import annotations

import argparse
import json

from console.hosts.host import HostPool
from console.runs.service import launch
from console.settings.config import Config

HELP = "start PROFILE detached on its host(s) (pushes changes first; survives disconnects)"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("profile", help="a [profiles.*] name from the config")
    p.add_argument("--force", action="store_true",
                   help="start even if this profile already has a running run")
    p.add_argument("--json", action="store_true", help="print the run records as JSON")


async def run(args: argparse.Namespace, config: Config) -> int:
    pool = HostPool(config)
    try:
        started = await launch(config, args.profile, pool, force=args.force)
    finally:
        await pool.close()
    if args.json:
        print(json.dumps({"id": started.id, "status": started.status,
                          "records": [r.to_json() for r in started.records]}, indent=2))
        return 0
    print(started.id)
    for r in started.records:
        node = f" node {r.node_rank}/{r.nnodes}" if r.nnodes > 1 else ""
        if r.job_id:  # a Slurm job: queued (or already started) on the cluster
            why = f" ({r.reason})" if r.reason else ""
            print(f"  {r.host}: job {r.job_id} {r.status}{why}  {r.run_dir}")
            continue
        print(f"  {r.host}{node}: pid {r.pid} {r.status}  {r.run_dir}")
    return 0
