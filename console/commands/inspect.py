"""`eagle3-console inspect HOST PATH [--json]`: the engine's inspect report of a checkpoint on HOST.

The same report the checkpoints pane shows (format, tensors, config summary, checks); exits 1
when a check fails, like `python -m engine inspect`."""

from __future__ import annotations

import argparse
import json

from console.checkpoints.service import inspect_checkpoint
from console.hosts.host import HostPool
from console.settings.config import Config
from engine.inspect_report import render

HELP = "show a checkpoint's format, tensors, config and checks on HOST (exit 1 on a failed check)"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("host", help="a configured host name (`local` is built in)")
    p.add_argument("path", help="the checkpoint folder on that host")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")


async def run(args: argparse.Namespace, config: Config, pool: HostPool) -> int:
    host = await pool.ensure(args.host)
    report = await inspect_checkpoint(host, await host.resolve(args.path))
    print(json.dumps(report.to_json(), indent=2) if args.json else render(report.to_json()))
    return 0 if report.ok else 1
