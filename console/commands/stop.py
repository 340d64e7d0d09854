"""`eagle3-console stop RUN [--grace S]`: SIGTERM the run's process group, SIGKILL after S s.

Only a group whose leader is still the run's command (pid and start time as recorded) is
signalled; a run whose processes are gone is reported `lost` (exit status 1), untouched.
A command that holds SIGKILL off (a training run swapping its eval server's drafter back) is
waited for past the grace; what it could not finish is a warning (exit status 1).
A Slurm run (a host with scheduler = "slurm") is stopped with `scancel --signal=TERM`, then
`scancel` after S s (a queued job: `scancel` at once); no login-node process is signalled.
A pipeline's id stops each of its parts: the trainer, the producer, then the store."""

from __future__ import annotations

import argparse
import sys

from console.hosts.host import HostPool
from console.runs.pipeline import stop_any
from console.scheduler.run_status import RunStatus
from console.settings.config import Config

HELP = ("stop RUN on every node: SIGTERM its process group, SIGKILL after --grace seconds, "
        "later while the run swaps an eval server's drafter back (a Slurm job: scancel "
        "--signal=TERM, then scancel)")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="a run id (as `launch` printed it / `runs HOST` lists it), or a "
                               "pipeline's")
    p.add_argument("--grace", type=float, default=10.0,
                   help="seconds between SIGTERM and SIGKILL (default 10)")


async def run(args: argparse.Namespace, config: Config, pool: HostPool) -> int:
    stopped = await stop_any(config, args.run, pool, grace=args.grace)
    lost = 0
    for r in stopped.records:
        if r.status == RunStatus.LOST:  # its pids are gone or someone else's: nothing was signalled
            lost += 1
            why = r.refused or "its command and monitor are gone: not signalled"
            print(f"error: {r.id} on {r.host}: lost ({why})", file=sys.stderr)
            continue
        code = "" if r.exit_code is None else f" (exit {r.exit_code})"
        held = f" after {r.stop_held}" if r.stop_held else ""
        print(f"{r.id} on {r.host}: {r.status}{code}{held}")
        if r.stop_warning:  # the command could not finish its cleanup: the user must
            lost += 1
            print(f"warning: {r.id} on {r.host}: {r.stop_warning}", file=sys.stderr)
    return 1 if lost else 0
