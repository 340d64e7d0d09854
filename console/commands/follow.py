"""`eagle3-console follow RUN`: print a run's output (and its engine events) as it happens,
from the start, resuming by byte offset across dropped connections; ends when the run ends."""

from __future__ import annotations

import argparse
import asyncio
import json
import posixpath
import sys
import time

from console.config import Config
from console.follow import Line, LogFollower
from console.host import Host
from console.runs import close_hosts, find_run, list_runs
from engine import events

HELP = "print RUN's output and engine events as they come; ends when the run ends"
STATUS_EVERY = 2.0


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="a run id")
    p.add_argument("--node", type=int, default=0, help="which node of a multi-node run (default 0)")
    p.add_argument("-n", "--lines", type=int, default=None,
                   help="start at the last N lines instead of the beginning")


class RunWatch:
    """Whether the run is over, asked at most every STATUS_EVERY seconds."""

    def __init__(self, host: Host, run_id: str) -> None:
        self.host, self.run_id = host, run_id
        self.status = "running"
        self.exit_code: int | None = None
        self._asked = 0.0

    async def ended(self) -> bool:
        if time.monotonic() - self._asked >= STATUS_EVERY:
            self._asked = time.monotonic()
            recs = await list_runs(self.host, self.run_id)
            if recs:
                self.status, self.exit_code = recs[0].status, recs[0].exit_code
        return self.status != "running"


def render_event(line: Line) -> str | None:
    ev = events.parse(line.text)
    if ev is None:
        return line.display() if line.text.strip() else None
    if ev.kind == "progress":
        total = ev.get("total")
        return f"[{ev.get('desc') or ev.cmd}] {ev.get('done')}" + (f"/{total}" if total else "") + \
            f" {ev.get('unit', '')}"
    if ev.kind == "metric":
        vals = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in (ev.get("values") or {}).items())
        return f"step {ev.get('step')}: {vals}"
    if ev.kind == "log":
        level = ev.get("level", "info")
        return ("" if level == "info" else f"{level}: ") + str(ev.get("msg", ""))
    if ev.kind == "result":
        return "result: " + json.dumps(ev.get("data", {}))[:2000]
    if ev.kind == "error":
        return f"error: {ev.get('msg')}"
    return None


async def run(args: argparse.Namespace, config: Config) -> int:
    pool: dict[str, Host] = {}
    try:
        nodes = await find_run(config, args.run, pool)
        match = [hr for hr in nodes if hr[1].node_rank == args.node] or nodes[:1]
        host, rec = match[0]
        run_dir = rec.run_dir or posixpath.join(await host.root(), "runs", args.run)
        watch = RunWatch(host, args.run)
        names = ["output.log"] + (["events.jsonl"] if rec.raw.get("engine") else [])
        start = "begin" if args.lines is None else "end"
        followers = [LogFollower(host.transport, posixpath.join(run_dir, n), start=start,
                                 tail_lines=args.lines, until=watch.ended,
                                 on_notice=lambda k, d: print(f"-- {k}: {d}", file=sys.stderr))
                     for n in names]

        async def pump(f: LogFollower, is_events: bool) -> None:
            async for batch in f.batches():
                for line in batch:
                    text = render_event(line) if is_events else line.display()
                    if text is not None:
                        sys.stdout.write(text + "\n")
                sys.stdout.flush()

        await asyncio.gather(*(pump(f, n == "events.jsonl") for f, n in zip(followers, names)))
        code = "" if watch.exit_code is None else f", exit {watch.exit_code}"
        print(f"-- run {args.run} {watch.status}{code}", file=sys.stderr)
    finally:
        await close_hosts(pool)
    return 0
