"""`eagle3-console follow RUN`: print a run's output (and its engine events) as it happens,
from the start, resuming by byte offset across dropped connections; ends when the run ends.

A training step is one compact line (`step 37/150  loss 5.498  acc_0 0.866  tau 3.660  ETA
1:12`); `--json` prints every event whole instead, one JSON object a line (output lines as
{"kind": "output", "file", "offset", "text"})."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import posixpath
import sys
import time

from console.hosts.host import Host, HostPool
from console.logs.follow import Line, LogFollower
from console.runs.service import find_run, list_runs
from console.settings.config import Config
from engine import events

HELP = "print RUN's output and engine events as they come; ends when the run ends"
STATUS_EVERY = 2.0


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="a run id")
    p.add_argument("--node", type=int, default=0, help="which node of a multi-node run (default 0)")
    p.add_argument("-n", "--lines", type=int, default=None,
                   help="start at the last N lines instead of the beginning")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per line: every engine event with all its fields, "
                        "and each output line as {\"kind\": \"output\", ...}")


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
        return self.status not in ("running", "pending")  # pending: a queued Slurm job


class MalformedEvent(ValueError):
    """An event line whose fields are not what its kind promises (the message says which)."""


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise MalformedEvent(what)


def render_event(line: Line) -> str | None:
    """One events.jsonl line as text: None for nothing to show; raises MalformedEvent for an
    event whose fields are not of the types its kind promises (never an AttributeError)."""
    ev = events.parse(line.text)
    if ev is None:
        return line.display() if line.text.strip() else None
    if ev.kind == "progress":
        done, total, unit, desc = ev.get("done"), ev.get("total"), ev.get("unit"), ev.get("desc")
        _check(_number(done), "progress: done is not a number")
        _check(total is None or _number(total), "progress: total is not a number")
        _check(unit is None or isinstance(unit, str), "progress: unit is not a string")
        _check(desc is None or isinstance(desc, str), "progress: desc is not a string")
        return f"[{desc or ev.cmd}] {done}" + (f"/{total}" if total else "") + f" {unit or ''}"
    if ev.kind == "metric":
        values, step = ev.get("values"), ev.get("step")
        _check(isinstance(values, dict), "metric: values is not an object")
        _check(step is None or _number(step), "metric: step is not a number")
        return f"step {step}: {compact(values)}"
    if ev.kind == "log":
        level, msg = ev.get("level", "info"), ev.get("msg", "")
        _check(isinstance(level, str), "log: level is not a string")
        _check(isinstance(msg, str), "log: msg is not a string")
        return ("" if level == "info" else f"{level}: ") + msg
    if ev.kind == "result":  # its scalars (paths, counts); nested figures are in --json
        data = ev.get("data", {})
        scalars = {k: v for k, v in data.items() if not isinstance(v, (dict, list))} \
            if isinstance(data, dict) else {}
        return "result: " + ("  ".join(f"{k} {v}" for k, v in scalars.items()) if scalars
                             else json.dumps(data)[:200])
    if ev.kind == "error":
        msg = ev.get("msg")
        _check(isinstance(msg, str), "error: msg is not a string")
        return f"error: {msg}"
    return None


#: the fields of a step's line, in order (every field is in --json)
STEP_FIELDS = ("loss", "acc_0", "tau")


def compact(values: dict[str, object]) -> str:
    """A step's metrics in a few columns: loss, acc_0 and tau (`loss 5.498  acc_0 0.866  tau
    3.660`); a metric event without any of them shows its first four values instead."""
    keys = [k for k in STEP_FIELDS if k in values] or list(values)[:4]
    return "  ".join(f"{k} {_fmt(values[k])}" for k in keys)


def _fmt(v: object) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


class StepLines:
    """One line per training step: the engine writes a step's metric, then its progress; the
    two are printed together (`step 37/150  loss 5.498  acc_0 0.866  tau 3.660  ETA 1:12`). A
    metric whose progress has not arrived by the end of a batch is printed alone (with the
    last total seen), and that progress is then dropped."""

    def __init__(self) -> None:
        self.pending: tuple[object, str] | None = None   # (step, "k v …") held for its progress
        self.printed_step: object = None                 # the step of the last metric printed
        self.total: object = None                        # the last progress event's total

    def head(self, step: object) -> str:
        """`step  37/150`: the step right-aligned to the total's width, so columns stay put."""
        total = self.total
        return f"step {step!s:>{len(str(total))}}/{total}" if _number(total) and total \
            else f"step {step}"

    def add(self, line: Line) -> list[str]:
        """Lines to print for one event line (raises MalformedEvent like render_event)."""
        text = render_event(line)
        ev = events.parse(line.text)
        if ev is not None and ev.kind == "metric":
            out = self.flush()
            self.pending = (ev.get("step"), text.split(": ", 1)[1] if text else "")
            return out
        if ev is not None and ev.kind == "progress" and ev.get("unit") == "step":
            done, total, eta = ev.get("done"), ev.get("total"), ev.get("eta_s")
            self.total = total
            if self.pending is not None and self.pending[0] == done:
                vals = self.pending[1]
                self.pending, self.printed_step = None, done
                eta_text = f"  ETA {_clock(eta)}" if _number(eta) and math.isfinite(eta) \
                    and done != total else ""   # an ETA of NaN or 1e400 is no ETA
                return [f"{self.head(done)}  {vals}{eta_text}"]
            if done == self.printed_step:
                return []
        return [*self.flush(), *([text] if text is not None else [])]

    def flush(self) -> list[str]:
        if self.pending is None:
            return []
        step, vals = self.pending
        self.pending, self.printed_step = None, step
        return [f"{self.head(step)}  {vals}"]


def _clock(seconds: object) -> str:
    s = int(seconds) if _number(seconds) else 0  # type: ignore[call-overload]
    h, rem = divmod(s, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}" if h else f"{rem // 60}:{rem % 60:02d}"


def json_lines(line: Line, name: str) -> list[str]:
    """--json: an engine event as the engine wrote it (every field), any other line as
    {"kind": "output", "file", "offset", "text"} (blank lines of events.jsonl skipped)."""
    if name == "events.jsonl":
        if events.parse(line.text) is not None:
            return [line.text.strip()]
        if not line.text.strip():
            return []
    return [json.dumps({"kind": "output", "file": name, "offset": line.offset,
                        "text": line.text})]


class Skipped:
    """Malformed event lines: each of the first few named on stderr, all of them counted."""

    SHOWN = 5

    def __init__(self) -> None:
        self.count = 0

    def add(self, line: Line, why: str) -> None:
        self.count += 1
        if self.count <= self.SHOWN:
            print(f"-- skipped a malformed event at byte {line.offset}: {why}", file=sys.stderr)


async def run(args: argparse.Namespace, config: Config) -> int:
    pool = HostPool(config)
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

        skipped = Skipped()

        async def pump(f: LogFollower, name: str) -> None:
            is_events = name == "events.jsonl"
            steps = StepLines()
            async for batch in f.batches():
                for line in batch:
                    try:
                        texts = json_lines(line, name) if args.json else \
                            steps.add(line) if is_events else [line.display()]
                    except MalformedEvent as e:
                        skipped.add(line, str(e))
                        continue
                    sys.stdout.writelines(t + "\n" for t in texts)
                sys.stdout.writelines(t + "\n" for t in steps.flush())
                sys.stdout.flush()

        await asyncio.gather(*(pump(f, n) for f, n in zip(followers, names, strict=True)))
        if skipped.count:
            print(f"-- warning: skipped {skipped.count} malformed event line"
                  f"{'s' if skipped.count > 1 else ''}", file=sys.stderr)
        code = "" if watch.exit_code is None else f", exit {watch.exit_code}"
        print(f"-- run {args.run} {watch.status}{code}", file=sys.stderr)
    finally:
        await pool.close()
    return 0
