"""`eagle3-console stop RUN [--grace S]`: SIGTERM the run's process group, SIGKILL after S s."""

from __future__ import annotations

import argparse

from console.config import Config
from console.host import Host
from console.runs import close_hosts, stop_run

HELP = "stop RUN on every node: SIGTERM its process group, SIGKILL after --grace seconds"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="a run id (as `launch` printed it / `runs HOST` lists it)")
    p.add_argument("--grace", type=float, default=10.0,
                   help="seconds between SIGTERM and SIGKILL (default 10)")


async def run(args: argparse.Namespace, config: Config) -> int:
    pool: dict[str, Host] = {}
    try:
        stopped = await stop_run(config, args.run, pool, grace=args.grace)
    finally:
        await close_hosts(pool)
    for r in stopped.records:
        code = "" if r.exit_code is None else f" (exit {r.exit_code})"
        print(f"{r.id} on {r.host}: {r.status}{code}")
    return 0
