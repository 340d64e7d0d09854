"""`eagle3-console follow RUN`: print a run's output (and its engine events) as it happens,
from the start, resuming by byte offset across dropped connections; ends when the run ends.
A host that cannot be reached while the run is looked up is asked again the same way
(`launch && follow` as the host blips); a run id that no answering host has fails at once.

A training step is one compact line (`step 37/150  loss 5.498  acc_0 0.866  tau 3.660  ETA
1:12`), a checkpoint measured in a running vLLM (train --eval-server) one line of its own
(`served acceptance at step 50: 2.503  pos 0.610 0.480 0.330  (16 prompts)`); `--json` prints
every event whole instead, one JSON object a line (output lines as {"kind": "output", "file",
"offset", "text"}). The engine's error is printed once (it is both an event and a line of its
stderr); a run that could not start shows the runner's recorded reason. The exit status is the
run's outcome: 0 succeeded, 1 failed, 3 stopped, 4 lost, 5 corrupt
(console/scheduler/run_status.py EXIT_CODES).

A pipeline's id (console/runs/pipeline.py) follows its trainer, with its producer's lines
marked `[producer] `, until both have ended; its store is then stopped, each part's outcome is
said, and the exit status is the pipeline's."""

from __future__ import annotations

import argparse
import asyncio
import json
import posixpath
import re
import sys
from collections.abc import Awaitable, Callable, Mapping

from console.hosts.host import Host, HostPool
from console.logs.follow import BACKOFF_FIRST, BACKOFF_MAX, Line, LogFollower
from console.runs.pipeline import find_pipeline, pipeline_profile, settle
from console.runs.service import RunHostDown, find_run
from console.runs.watch import RunFeed
from console.scheduler.pipeline import PipelineRun
from console.scheduler.run_record import RunRecord
from console.scheduler.run_status import EXIT_CODES
from console.settings.config import PARTS, Config
from engine import events
from engine.events import MalformedEvent

HELP = "print RUN's output and engine events as they come; ends when the run ends"
#: how a run is looked up: find_run, or find_pipeline for a pipeline's parts
Finder = Callable[[Config, str, HostPool], Awaitable[list[tuple[Host, RunRecord]]]]


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="a run id")
    p.add_argument("--node", type=int, default=0, help="which node of a multi-node run (default 0)")
    p.add_argument("-n", "--lines", type=int, default=None,
                   help="start at the last N lines instead of the beginning")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per line: every engine event with all its fields, "
                        "and each output line as {\"kind\": \"output\", ...}")


def render_event(line: Line) -> str | None:
    """One events.jsonl line as text: None for nothing to show; raises MalformedEvent for an
    event whose fields are not of the types its kind promises (engine/events.py decode)."""
    ev = events.decode(line.text)
    return line.display() if ev is None and line.text.strip() else render(ev)


def render(ev: events.Event | None) -> str | None:
    if isinstance(ev, events.Progress):
        return f"[{ev.desc or ev.cmd}] {ev.done}" + (f"/{ev.total}" if ev.total else "") + \
            f" {ev.unit}"
    if isinstance(ev, events.Metric) and ev.name:
        return named_metric(ev)
    if isinstance(ev, events.Metric):
        return f"step {ev.step}: {compact(ev.values)}"
    if isinstance(ev, events.Log):
        return ("" if ev.level == "info" else f"{ev.level}: ") + ev.msg
    if isinstance(ev, events.Result):  # its scalars (paths, counts); nested figures are in --json
        scalars = {k: v for k, v in ev.data.items() if not isinstance(v, (dict, list))}
        return "result: " + ("  ".join(f"{k} {v}" for k, v in scalars.items()) if scalars
                             else json.dumps(ev.data)[:200])
    if isinstance(ev, events.Error):
        return f"error: {ev.msg}"
    return None


#: a served acceptance's per-position key (ASCII digits: int() would take other scripts' too)
POSITION = re.compile(r"pos_([0-9]{1,6})")

#: the fields of a step's line, in order (every field is in --json)
STEP_FIELDS = ("loss", "acc_0", "tau")


def compact(values: Mapping[str, object]) -> str:
    """A step's metrics in a few columns: loss, acc_0 and tau (`loss 5.498  acc_0 0.866  tau
    3.660`); a metric event without any of them shows its first four values instead."""
    keys = [k for k in STEP_FIELDS if k in values] or list(values)[:4]
    return "  ".join(f"{k} {_fmt(values[k])}" for k in keys)


def named_metric(ev: events.Metric) -> str:
    """A metric event that is not a training step's: served acceptance as its figures
    (`served acceptance at step 50: 2.503  pos 0.610 0.480  (16 prompts)`), another name as
    its first values."""
    if ev.name != events.SERVED:   # a producer's figures belong to no step
        at = "" if ev.step is None else f" at step {ev.step}"
        return f"{ev.name}{at}: {compact(ev.values)}"
    v = ev.values
    # pos_0, pos_1, ... in position order; any other key (pos_x) is not a position: --json has it
    ranks = {k: int(m[1]) for k in v if (m := POSITION.fullmatch(k))}
    pos = [v[k] for k in sorted(ranks, key=ranks.__getitem__)]
    text = f"{ev.name} at step {ev.step}: {_fmt(v.get('acceptance_length'))}"
    if pos:
        text += "  pos " + " ".join(_fmt(p) for p in pos)
    return text + f"  ({_fmt(v.get('prompts'))} prompts)"


def _fmt(v: object) -> str:
    """A metric value: 3 decimals, `-` for one that was not a finite number."""
    return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


class StepLines:
    """One line per training step: the engine writes a step's metric, then its progress; the
    two are printed together (`step 37/150  loss 5.498  acc_0 0.866  tau 3.660  ETA 1:12`). A
    metric whose progress has not arrived by the end of a batch is printed alone (with the
    last total seen), and that progress is then dropped."""

    def __init__(self) -> None:
        self.pending: tuple[int | None, str] | None = None  # (step, "k v …") for its progress
        self.printed_step: int | None = None                # the step of the last metric printed
        self.total: int | None = None                       # the last progress event's total

    def head(self, step: int | None) -> str:
        """`step  37/150`: the step right-aligned to the total's width, so columns stay put."""
        total = self.total
        return f"step {step!s:>{len(str(total))}}/{total}" if total else f"step {step}"

    def add(self, line: Line) -> list[str]:
        """Lines to print for one event line (raises MalformedEvent like render_event)."""
        ev = events.decode(line.text)
        text = line.display() if ev is None and line.text.strip() else render(ev)
        if isinstance(ev, events.Metric) and ev.name:  # its own line, not a step's
            return [*self.flush(), named_metric(ev)]
        if isinstance(ev, events.Metric):
            out = self.flush()
            self.pending = (ev.step, compact(ev.values))
            return out
        if isinstance(ev, events.Progress) and ev.unit == "step":
            done, total, eta = ev.done, ev.total, ev.eta_s
            self.total = total
            if self.pending is not None and self.pending[0] == done:
                vals = self.pending[1]
                self.pending, self.printed_step = None, done
                eta_text = f"  ETA {_clock(eta)}" if eta is not None and done != total else ""
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


def _clock(seconds: float) -> str:
    s = int(seconds)   # finite and bounded: engine/events.py decode
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


class ErrorsOnce:
    """The engine's error is an event and a stderr line (`error: MSG`, with `(run with --debug
    for the traceback)` after an unexpected one): each message is printed once, whichever
    file is read first."""

    SUFFIX = " (run with --debug for the traceback)"

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def first(self, text: str) -> bool:
        """Whether a line to print is new (False: an error already printed)."""
        if not text.startswith("error: "):
            return True
        msg = text.removeprefix("error: ").removesuffix(self.SUFFIX)
        if msg in self.seen:
            return False
        self.seen.add(msg)
        return True


class Notices:
    """The followers' notices on stderr, naming the file (`-- reconnected: output.log: resuming
    at byte 0`); the connection's own `reconnecting` is one for both files."""

    def __init__(self) -> None:
        self.down = False

    def of(self, name: str) -> Callable[[str, str], None]:
        """The on_notice of the follower of `name`."""
        return lambda kind, detail: self.add(name, kind, detail)

    def add(self, name: str, kind: str, detail: str) -> None:
        if kind == "reconnecting":
            if self.down:
                return
            self.down = True
        elif kind == "reconnected":
            self.down = False
            detail = f"{name}: {detail}" if name else detail
        else:
            detail = f"{name}: {detail}" if detail else name
        print(f"-- {kind}: {detail}", file=sys.stderr)


class Skipped:
    """Malformed event lines: each of the first few named on stderr, all of them counted."""

    SHOWN = 5

    def __init__(self) -> None:
        self.count = 0

    def add(self, line: Line, why: str) -> None:
        self.count += 1
        if self.count <= self.SHOWN:
            print(f"-- skipped a malformed event at byte {line.offset}: {why}", file=sys.stderr)


async def look_up(config: Config, run_id: str, pool: HostPool, notices: Notices,
                  find: Finder = find_run) -> list[tuple[Host, RunRecord]]:
    """find_run (or `find`), looked for again with the followers' backoff and notices while a
    host that could hold the run cannot be asked (`launch && follow` as the host blips), with
    no limit, as the followers have none (ctrl+c ends it); a run that no host answering has
    fails at once."""
    delay, failing = BACKOFF_FIRST, False
    while True:
        try:
            nodes = await find(config, run_id, pool)
        except RunHostDown as e:
            if not failing:
                notices.add("", "reconnecting", str(e.down[0]))
            failing = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX)
            continue
        if failing:
            notices.add("", "reconnected", f"run {run_id} found on {nodes[0][0].name}")
        return nodes


class Printer:
    """What the followers of one `follow` share: the output mode, the malformed lines skipped,
    the errors already printed and the notices."""

    def __init__(self, as_json: bool, notices: Notices) -> None:
        self.as_json, self.notices = as_json, notices
        self.skipped, self.errors = Skipped(), ErrorsOnce()

    async def follow(self, host: Host, rec: RunRecord, lines: int | None,
                     prefix: str = "", progress: bool = True) -> RunFeed:
        """Print one run's files until it has ended; prefix: put before each line (a
        pipeline's producer), progress: whether its progress events are printed."""
        run_dir = rec.run_dir or posixpath.join(await host.root(), "runs", rec.id)
        feed = RunFeed(host, rec)
        names = ["output.log"] + (["events.jsonl"] if rec.engine else [])
        start = "begin" if lines is None else "end"
        followers = [LogFollower(host.transport, posixpath.join(run_dir, n), start=start,
                                 tail_lines=lines, until=feed.ended,
                                 on_notice=self.notices.of(prefix + n))
                     for n in names]
        await asyncio.gather(*(self._pump(f, n, prefix, progress)
                               for f, n in zip(followers, names, strict=True)))
        return feed

    async def _pump(self, f: LogFollower, name: str, prefix: str, progress: bool) -> None:
        is_events = name == "events.jsonl"
        steps = StepLines()
        async for batch in f.batches():
            for line in batch:
                try:
                    if not progress and is_events and \
                            isinstance(events.decode(line.text), events.Progress):
                        continue
                    texts = json_lines(line, name) if self.as_json else \
                        steps.add(line) if is_events else [line.display()]
                except MalformedEvent as e:
                    self.skipped.add(line, str(e))
                    continue
                sys.stdout.writelines(prefix + t + "\n" for t in texts
                                      if self.as_json or self.errors.first(t))
            sys.stdout.writelines(prefix + t + "\n" for t in steps.flush())
            sys.stdout.flush()

    def close(self) -> None:
        n = self.skipped.count
        if n:
            print(f"-- warning: skipped {n} malformed event line{'s' if n > 1 else ''}",
                  file=sys.stderr)


async def run(args: argparse.Namespace, config: Config, pool: HostPool) -> int:
    notices = Notices()
    printer = Printer(args.json, notices)
    if pipeline_profile(config, args.run) is not None:
        return await follow_pipeline(args, config, pool, printer)
    nodes = await look_up(config, args.run, pool, notices)
    match = [hr for hr in nodes if hr[1].node_rank == args.node] or nodes[:1]
    host, rec = match[0]
    feed = await printer.follow(host, rec, args.lines)
    printer.close()
    end = feed.record
    code = "" if end.exit_code is None else f", exit {end.exit_code}"
    why = f": {end.failure}" if end.failure else ""
    print(f"-- run {args.run} {end.status}{code}{why}", file=sys.stderr)
    return EXIT_CODES.get(end.status, 0)


async def follow_pipeline(args: argparse.Namespace, config: Config, pool: HostPool,
                          printer: Printer) -> int:
    """A pipeline: its trainer's output and steps (node --node), with its producer's lines
    (`[producer] ...`, without its per-sample progress) among them, until both have ended;
    then its store is stopped and the outcome said part by part."""
    found = await look_up(config, args.run, pool, printer.notices, find_pipeline)
    trainer = [hr for hr in found if hr[1].part == "trainer"]
    trainer = [hr for hr in trainer if hr[1].node_rank == args.node] or trainer[:1]
    producer = [hr for hr in found if hr[1].part == "producer"][:1]
    await asyncio.gather(*(printer.follow(h, r, args.lines) for h, r in trainer),
                         *(printer.follow(h, r, args.lines, "[producer] ", progress=False)
                           for h, r in producer))
    printer.close()
    pipe = PipelineRun(args.run, tuple(r for _h, r in await find_pipeline(config, args.run,
                                                                           pool)))
    pipe = await settle(config, pipe, pool)
    for part in PARTS:
        for r in pipe.part(part):
            code = "" if r.exit_code is None else f", exit {r.exit_code}"
            why = f": {r.failure}" if r.failure else ""
            print(f"-- {part} {r.id} on {r.host}: {r.status}{code}{why}", file=sys.stderr)
    print(f"-- pipeline {args.run} {pipe.status}", file=sys.stderr)
    return EXIT_CODES.get(pipe.status, 0)
