"""`eagle3-console metrics HOST [--url URL] [--json] [--once] [--interval S] [--count N]`: a vLLM
server's exact acceptance figures from its /metrics, fetched through HOST's own connection.

Each scrape prints the figures since the previous one (counter differences) and since the
server started; a server restart (counters going down) starts a new series. With --once one
scrape and a non-zero exit when it fails; otherwise a failed scrape prints one line and the
next interval tries again."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from console.errors import ConsoleError
from console.hosts.host import HostPool
from console.logs.metrics_service import MetricsError, MetricsWatch
from console.logs.vllm_metrics import Figures, Report
from console.settings.config import Config
from console.settings.metrics_url import DEFAULT_URL

HELP = "a vLLM server's acceptance length, per-position acceptance and throughput from /metrics"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("host", help="a configured host name (the server runs there)")
    p.add_argument("--url", help="the metrics URL as seen from the host (default: the host's "
                                 f"`metrics` setting, else {DEFAULT_URL})")
    p.add_argument("--json", action="store_true", help="one JSON object per scrape")
    p.add_argument("--once", action="store_true", help="one scrape; exit 1 when it fails")
    p.add_argument("--interval", type=float, default=10.0, metavar="S",
                   help="seconds between scrapes (default 10, vLLM's own log interval)")
    p.add_argument("--count", type=int, default=None, metavar="N",
                   help="stop after N scrapes (default: until interrupted)")


async def run(args: argparse.Namespace, config: Config, pool: HostPool) -> int:
    url = args.url or config.host(args.host).metrics or DEFAULT_URL
    try:
        watch = MetricsWatch(url)
    except ValueError as e:
        raise ConsoleError(f"--url {url}: expected {e}") from None
    if args.interval <= 0 or (args.count is not None and args.count < 1):
        raise ConsoleError("--interval must be positive and --count at least 1")
    count = 1 if args.once else args.count
    host = await pool.ensure(args.host)
    failures = 0
    n = 0
    while count is None or n < count:
        if n:
            await asyncio.sleep(args.interval)
        n += 1
        try:
            report = await watch.poll(host.transport)
        except MetricsError as e:
            if args.once:
                raise
            failures += 1
            _emit_error(args, e)
            continue
        head = {"host": args.host, "url": url}
        print(json.dumps(report.to_dict(**head)) if args.json else render(report),
              flush=True)
    return 1 if count is not None and failures == count else 0


def _emit_error(args: argparse.Namespace, e: MetricsError) -> None:
    if args.json:
        print(json.dumps({"host": e.host, "url": e.url, "t": round(time.time(), 3),
                          "error": e.why}), flush=True)
    print(f"-- {e}", file=sys.stderr, flush=True)


def _f(v: float | None, digits: int = 2, unit: str = "") -> str:
    return "-" if v is None else f"{v:,.{digits}f}{unit}"


def _part(f: Figures) -> str:
    pos = " ".join(f"{p:.2f}" for p in f.per_position[:8]) or "-"
    return (f"accept len {_f(f.acceptance_length)}  rate "
            f"{_f(None if f.acceptance_rate is None else 100 * f.acceptance_rate, 1, '%')}  "
            f"per-pos [{pos}]  drafts {f.drafts if f.drafts is not None else '-'}  "
            f"gen {_f(f.generation_tokens_per_s, 1)} tok/s")


def render(r: Report) -> str:
    """Two short lines per scrape: the last interval, then since the server started."""
    s = r.snapshot
    stamp = time.strftime("%H:%M:%S", time.localtime(s.t))
    gauges = (f"running {_f(s.running, 0)}  waiting {_f(s.waiting, 0)}  kv "
              f"{_f(None if s.kv_cache_usage is None else 100 * s.kv_cache_usage, 1, '%')}")
    lines: list[Any] = []
    if r.reset:
        lines.append(f"{stamp} counters went down (server restarted): series {r.series}")
    step = f"last {r.interval.seconds:.1f} s: {_part(r.interval)}" if r.interval and \
        r.interval.seconds is not None else "first scrape"
    lines.append(f"{stamp} {step}  {gauges}")
    lines.append(f"{' ' * len(stamp)} since start: {_part(r.total)}")
    return "\n".join(lines)
