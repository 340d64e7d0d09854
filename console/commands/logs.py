"""`eagle3-console logs HOST PATH [--follow] [--lines N] [--metrics] [--json]`: a host file's
last lines (tail), optionally followed; --metrics keeps only vLLM metrics lines, parsed."""

from __future__ import annotations

import argparse
import json
import sys

from console.errors import ConsoleError
from console.hosts.host import HostPool
from console.logs.follow import LogFollower
from console.logs.vllm_log import MARKERS, EngineStats, Metrics, parse_line
from console.settings.config import Config

HELP = "print (and --follow) a file on HOST; --metrics parses vLLM stats lines (--json: records)"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("host", help="a configured host name")
    p.add_argument("path", help="the file on the host (e.g. /root/vllm.log)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing what is appended")
    p.add_argument("-n", "--lines", type=int, default=None,
                   help="start at the last N lines (default 10; with --metrics the whole file)")
    p.add_argument("--metrics", action="store_true",
                   help="only vLLM engine-stats and SpecDecoding lines, parsed")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per line ({offset, text}, or the metrics record)")


async def run(args: argparse.Namespace, config: Config) -> int:
    pool = HostPool(config)
    host = await pool.ensure(args.host)
    path = await host.resolve(args.path)
    st = await host.transport.stat(path)
    if (st is None and not args.follow) or (st is not None and st.is_dir):
        await pool.close()
        what = "no such file" if st is None else "is a directory (logs prints a file)"
        raise ConsoleError(f"{args.host}: {path}: {what}")
    lines = args.lines if args.lines is not None else (None if args.metrics else 10)
    follower = LogFollower(host.transport, path, start="begin", tail_lines=lines,
                           follow=args.follow, on_notice=_notice)
    out = sys.stdout
    try:
        async for batch in follower.batches():
            if args.metrics:
                for line in batch.containing(MARKERS):
                    rec = parse_line(line.text)
                    if rec is not None:
                        out.write((json.dumps(rec.to_dict()) if args.json else render(rec)) + "\n")
                out.flush()
                continue
            for line in batch:
                if args.json:
                    out.write(json.dumps({"offset": line.offset, "text": line.text}) + "\n")
                else:
                    out.write(line.display() + "\n")
            out.flush()
    finally:
        await pool.close()
    return 0


def _notice(kind: str, detail: str) -> None:
    print(f"-- {kind}: {detail}", file=sys.stderr, flush=True)


def render(m: Metrics) -> str:
    """One short human line for a metrics record."""
    ts = f"{m.timestamp} " if m.timestamp else ""
    if isinstance(m, EngineStats):
        return (f"{ts}engine  gen {_f(m.generation_throughput)} tok/s  prompt "
                f"{_f(m.prompt_throughput)} tok/s  running {_f(m.running)}  waiting "
                f"{_f(m.waiting)}  kv {_f(m.kv_cache_usage_pct)}%")
    pos = " ".join(f"{x:.2f}" for x in m.per_position)
    return (f"{ts}spec    accept len {_f(m.mean_acceptance_length)}  accepted {_f(m.accepted)}/"
            f"{_f(m.drafted)}  rate {_f(m.draft_acceptance_rate_pct)}%  per-pos [{pos}]")


def _f(v: float | int | None) -> str:
    if v is None:
        return "-"
    return f"{v:g}" if isinstance(v, int) else f"{v:.2f}".rstrip("0").rstrip(".")
