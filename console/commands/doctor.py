"""`eagle3-console doctor HOST`: the same report the console shows for a host, without the TUI."""

from __future__ import annotations

import argparse
import json

from console.hosts.doctor_report import render
from console.hosts.engine_client import doctor
from console.hosts.host import HostPool
from console.settings.config import Config

HELP = ("what HOST can run: Python, engine packages, torch/CUDA, GPUs, vLLM, free disk; "
        "exit 1 when it cannot run the engine")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("host", help="a configured host name (`local` is built in)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


async def run(args: argparse.Namespace, config: Config, pool: HostPool) -> int:
    host = await pool.ensure(args.host)
    report = await doctor(host)
    print(json.dumps(report, indent=2) if args.json else render(report))
    # 1 when the host cannot run the engine (a missing or broken package), so scripts see it
    return 1 if report.get("problems") else 0
