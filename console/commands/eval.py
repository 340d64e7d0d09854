"""`eagle3-console eval HOST CKPT --target T --data D [-k K] [--samples N] [--vllm-engine]
[--json]`: the offline acceptance of a drafter on HOST, measured there by `python -m engine
eval` (the Checkpoints pane's `e`). `--vllm-engine` counts with vLLM's own engine and counters, for
targets transformers cannot hold."""

from __future__ import annotations

import argparse
import json
import sys

from console.checkpoints.evaluate import EvalRequest, evaluate_checkpoint
from console.hosts.host import HostPool
from console.settings.config import Config
from engine import events

HELP = "measure a drafter's acceptance on HOST's held-out data (engine eval)"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("host", help="a configured host name (`local` is built in)")
    p.add_argument("ckpt", help="drafter checkpoint folder on that host (any style)")
    p.add_argument("--target", required=True, help="the target model folder on that host")
    p.add_argument("--data", required=True,
                   help="prepared data folder on that host (its samples are replayed)")
    p.add_argument("-k", "--steps", type=int, default=3, dest="k",
                   help="draft tokens per step (default 3)")
    p.add_argument("--samples", type=int, default=64, help="samples replayed (default 64)")
    p.add_argument("--vllm-engine", action="store_true",
                   help="run the target in vLLM with the drafter as its speculative config")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")


async def run(args: argparse.Namespace, config: Config, pool: HostPool) -> int:
    tty = sys.stderr.isatty() and not args.json

    def progress(ev: events.Event) -> None:
        if tty and isinstance(ev, events.Progress):
            print(f"\r{ev.desc or 'eval'} {ev.done}/{ev.total} {ev.unit}", end="",
                  file=sys.stderr)

    try:
        host = await pool.ensure(args.host)
        req = EvalRequest(await host.resolve(args.ckpt), await host.resolve(args.target),
                          await host.resolve(args.data), k=args.k, max_samples=args.samples,
                          vllm_engine=args.vllm_engine)
        result = await evaluate_checkpoint(host, req, on_event=progress)
    finally:
        if tty:
            print(file=sys.stderr)
    print(json.dumps(result.to_json(), indent=2) if args.json
          else f"{args.host}: {args.ckpt}: {result.line()}")
    return 0
