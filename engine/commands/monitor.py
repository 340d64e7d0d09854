"""`python -m engine monitor`: the console's GPU/host agent, one `sample` event per interval.

    python -m engine monitor --events --interval 1 --path /data     (what the console starts)
    python -m engine monitor --count 3                               (a human glance)

The record is documented in engine/monitor.py. Samples are taken on a fixed schedule (no drift);
a slow sample skips ticks instead of bunching them. Stops after --count samples, or when the
reader goes away (the console closing the stream kills the process).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from engine.errors import UsageError
from engine.events import Emitter

HELP = "sample GPUs (NVML) and the host (CPU, memory, disk, network) every interval"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--interval", type=float, default=1.0,
                   help="seconds between samples (default 1)")
    p.add_argument("--path", default=".", help="report disk use of this path (default: .)")
    p.add_argument("--count", type=int, default=0,
                   help="stop after N samples (default: run until killed)")


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f}"


def render(data: dict[str, Any]) -> str:
    """One sample for humans."""
    lines = []
    if not data["gpus"]:
        lines.append(f"gpus: none ({data['reason']})")
    for g in data["gpus"]:
        if g.get("error"):
            lines.append(f"[{g['index']}] {g['name']}  ERROR {g['error']}")
            continue
        lines.append(f"[{g['index']}] {g['name']}  util {g['util']}%  mem {_gib(g['mem_used'])}/"
                     f"{_gib(g['mem_total'])} GiB  {g['power']} W  {g['temp']} C  "
                     f"procs {len(g['procs'])}")
    h = data.get("host")
    if h:
        cpu = sum(h["cpu"]) / max(1, len(h["cpu"]))
        lines.append(f"host: cpu {cpu:.0f}% of {len(h['cpu'])} cores  load {h['load']}  "
                     f"mem {_gib(h['mem_used'])}/{_gib(h['mem_total'])} GiB  "
                     f"net rx {h['net_rx']} B/s tx {h['net_tx']} B/s")
    return "\n".join(lines)


def run(args: argparse.Namespace, ev: Emitter) -> int:
    if not args.interval > 0.05:
        raise UsageError(f"--interval must be more than 0.05 s, got {args.interval}")
    if args.count < 0:
        raise UsageError(f"--count must be 0 (forever) or more, got {args.count}")
    from engine.monitor import Monitor

    mon = Monitor(args.path, args.interval)
    try:
        next_t = time.monotonic() + args.interval  # the first sample needs one interval of deltas
        n = 0
        while args.count == 0 or n < args.count:
            time.sleep(max(0.0, next_t - time.monotonic()))
            data = mon.sample()
            n += 1
            if ev.json_mode:
                ev.sample(data)
            else:
                print(render(data), flush=True)
            next_t += args.interval
            now = time.monotonic()
            if next_t < now:  # a sample took longer than the interval: skip, don't burst
                next_t = now + args.interval - (now - next_t) % args.interval
    finally:
        mon.close()
    return 0
