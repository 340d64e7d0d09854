"""`eagle3-console convert HOST SRC DST --to STYLE [--dtype D] [--force]`: convert a checkpoint
on HOST with the engine (streamed, written to a temp folder and renamed; DST absent on error),
then print the result's inspect checks."""

from __future__ import annotations

import argparse
import json
import sys

from console.checkpoints.results import convert_line
from console.checkpoints.service import DTYPES, STYLES, convert_checkpoint, inspect_checkpoint
from console.hosts.host import HostPool
from console.settings.config import Config
from engine import events

HELP = "convert a checkpoint on HOST (eagle, speculators, vllm or sglang style), then inspect it"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("host", help="a configured host name (`local` is built in)")
    p.add_argument("src", help="checkpoint folder on that host")
    p.add_argument("dst", help="output folder on that host (must not exist unless --force)")
    p.add_argument("--to", required=True, choices=STYLES, help="output style / serving engine")
    p.add_argument("--dtype", choices=DTYPES, default="keep",
                   help="cast floating-point tensors (default: keep the stored bytes)")
    p.add_argument("--verifier", metavar="NAME_OR_PATH",
                   help="the target model, recorded in a speculators config (needed for --to "
                        "speculators)")
    p.add_argument("--force", action="store_true",
                   help="replace DST if it is a drafter directory (config.json and weights, "
                        "nothing else) or empty; anything else is refused")
    p.add_argument("--json", action="store_true",
                   help="print the summary and the result's report as one JSON object")


async def run(args: argparse.Namespace, config: Config, pool: HostPool) -> int:
    host = await pool.ensure(args.host)
    tty = sys.stderr.isatty() and not args.json

    def progress(ev: events.Event) -> None:
        if tty and isinstance(ev, events.Progress):
            print(f"\rconvert {ev.done}/{ev.total} {ev.unit}", end="", file=sys.stderr)

    try:
        src, dst = await host.resolve(args.src), await host.resolve(args.dst)
        summary = await convert_checkpoint(host, src, dst, args.to, args.dtype, args.force,
                                           verifier=args.verifier, on_event=progress)
        report = await inspect_checkpoint(host, summary.dst)
    finally:
        if tty:
            print(file=sys.stderr)
    if args.json:
        print(json.dumps({"summary": summary.to_json(), "inspect": report.to_json()}, indent=2))
    else:
        print(convert_line(summary, args.to, wrote=True))
        for line in report.check_lines():
            print(line)
    return 0 if report.ok else 1
