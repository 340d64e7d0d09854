"""`eagle3-console logs HOST PATH [--follow] [--lines N] [--metrics] [--json]`: a host file's
last lines (tail), optionally followed; --metrics keeps only vLLM metrics lines, parsed, and
then --lines counts those (the last N metrics lines of the whole file). When the file holds
none, --metrics says so on stderr and exits 1 (like grep), unless following."""

from __future__ import annotations

import argparse
import json
import sys
from collections import deque

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
                   help="start at the last N lines (default 10); with --metrics the last N "
                        "metrics lines (default all)")
    p.add_argument("--metrics", action="store_true",
                   help="only vLLM engine-stats and SpecDecoding lines, parsed")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per line ({offset, text}, or the metrics record)")


async def run(args: argparse.Namespace, config: Config, pool: HostPool) -> int:
    host = await pool.ensure(args.host)
    path = await host.resolve(args.path)
    st = await host.transport.stat(path)
    if (st is None and not args.follow) or (st is not None and st.is_dir):
        what = "no such file" if st is None else "is a directory (logs prints a file)"
        raise ConsoleError(f"{args.host}: {path}: {what}")
    lines = None if args.metrics else args.lines if args.lines is not None else 10
    # --metrics --lines N: the last N metrics lines of the file, held until it is read to its
    # end (the follower is idle there: `until`), then printed; later ones as they come
    held: deque[str] | None = deque(maxlen=max(args.lines, 0)) \
        if args.metrics and args.lines is not None else None
    out = sys.stdout
    shown = 0

    def show(texts: list[str]) -> None:
        nonlocal shown, held
        if held is not None:
            held.extend(texts)
            return
        out.writelines(t + "\n" for t in texts)
        shown += len(texts)
        out.flush()

    def release() -> None:
        nonlocal held
        if held is not None:
            texts, held = list(held), None
            show(texts)

    async def at_end() -> bool:
        release()
        return False

    follower = LogFollower(host.transport, path, start="begin", tail_lines=lines,
                           follow=args.follow, on_notice=_notice, until=at_end)
    async for batch in follower.batches():
        if args.metrics:
            recs = [parse_line(line.text) for line in batch.containing(MARKERS)]
            show([json.dumps(r.to_dict()) if args.json else render(r)
                  for r in recs if r is not None])
            continue
        show([json.dumps({"offset": line.offset, "text": line.text}) if args.json
              else line.display() for line in batch])
    release()
    if args.metrics and not shown and not args.follow:
        print(f"-- no vLLM metrics lines in {args.host}:{path}", file=sys.stderr)
        return 1
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
