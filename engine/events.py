"""The event stream: the only contract shared by `engine` (which writes it) and `console` (which
reads it).

With `--events`, an engine command writes one JSON object per line to stdout and nothing else.
Every event carries:
    v     schema version (EVENTS_VERSION); a reader ignores events with a newer major version
    kind  one of KINDS
    t     unix time (float seconds)
    cmd   the engine command that wrote it ("train", "convert", ...)
and, by kind:
    progress  done: int, total: int | None, unit: str, desc: str, eta_s: float | None,
              rate: float | None
    metric    step: int | None, values: {name: number}   (e.g. loss, loss_0.., acc_0.., tau, lr)
              name: str, absent for a training step's numbers; SERVED ("served acceptance") for
              a checkpoint measured in a running vLLM (train --eval-server: acceptance_length,
              pos_0.., drafts, accepted, prompts, swap_s, replay_s)
    log       level: "debug" | "info" | "warning" | "error", msg: str
    result    data: {...}   the command's final answer (same content as its --json output)
    error     msg: str (one line), type: str
    sample    gpus: [...], host: {...}   one monitor-agent sample (engine/monitor.py documents it)
The engine writes no NaN or infinity (`encode` writes null; a metric's non-finite value also
gets a warning log naming it). A reader gets one frozen record per kind from `parse`
(Progress, Metric, Log, Result, Error, Sample), with every field of its type, numbers finite
and strings bounded, or None: the console reads events through these records only.
This module has no heavy imports: the console imports it without torch.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, ClassVar, TypeAlias

from engine.progress_bar import ProgressBar

EVENTS_VERSION = 1
KINDS = ("progress", "metric", "log", "result", "error", "sample")
LEVELS = ("debug", "info", "warning", "error")
#: a line longer than this is not an event (a result is the largest: an inspect report)
MAX_LINE = 8 * 1024 * 1024
#: a message is cut to this many characters; a name, unit, level or type to MAX_WORD
MAX_TEXT = 8000
MAX_WORD = 200
#: a metric event keeps at most this many values
MAX_VALUES = 512
#: an ETA or a rate beyond this is not a number worth showing (about 30 years)
MAX_SECONDS = 1e9
#: the name of a metric event holding a checkpoint's acceptance measured in a running vLLM
SERVED = "served acceptance"


class MalformedEvent(ValueError):
    """An event line whose fields are not what its kind promises (the message says which)."""


@dataclass(frozen=True)
class Progress:
    """How far a long step is: done of total units (total None: unknown)."""

    kind: ClassVar[str] = "progress"
    t: float
    cmd: str
    done: int
    total: int | None = None
    unit: str = ""
    desc: str = ""
    eta_s: float | None = None
    rate: float | None = None


@dataclass(frozen=True)
class Metric:
    """One step's numbers; a value the engine could not measure as a finite number is None.
    `name` is "" for a training step's numbers, else what they measure (SERVED)."""

    kind: ClassVar[str] = "metric"
    t: float
    cmd: str
    step: int | None = None
    values: Mapping[str, float | int | None] = field(default_factory=dict)
    name: str = ""


@dataclass(frozen=True)
class Log:
    kind: ClassVar[str] = "log"
    t: float
    cmd: str
    level: str = "info"
    msg: str = ""


@dataclass(frozen=True)
class Result:
    """The command's final answer (the same content as its --json output)."""

    kind: ClassVar[str] = "result"
    t: float
    cmd: str
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Error:
    kind: ClassVar[str] = "error"
    t: float
    cmd: str
    msg: str = ""
    type: str = ""


@dataclass(frozen=True)
class Sample:
    """One monitor-agent sample: the record engine/monitor.py documents (gpus, host, ...)."""

    kind: ClassVar[str] = "sample"
    t: float
    cmd: str
    data: Mapping[str, Any] = field(default_factory=dict)


Event: TypeAlias = Progress | Metric | Log | Result | Error | Sample


def encode(kind: str, cmd: str, payload: dict[str, Any], t: float | None = None) -> str:
    """One event as a JSON line (no trailing newline). A number that is not finite is written as
    null: JSON has no NaN, and a reader must never meet one."""
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}")
    obj = {"v": EVENTS_VERSION, "kind": kind, "t": time.time() if t is None else t, "cmd": cmd}
    obj.update(payload)
    return json.dumps(finite(obj), separators=(",", ":"), default=_json_default,
                      allow_nan=False)


def finite(o: Any) -> Any:
    """o with every float that is not finite replaced by None (dicts, lists and scalars that
    have `.item()`, such as numpy or torch ones, are walked)."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [finite(v) for v in o]
    if not isinstance(o, (str, int, type(None))) and hasattr(o, "item"):
        try:
            return finite(o.item())
        except (TypeError, ValueError):   # more than one element: its list
            return finite(o.tolist()) if hasattr(o, "tolist") else o
    return o


def parse(line: str | bytes) -> Event | None:
    """Parse one line; None for anything that is not an event we understand (never raises)."""
    try:
        return decode(line)
    except MalformedEvent:
        return None


def decode(line: str | bytes) -> Event | None:
    """One line as its typed event: None for a line that is no event of ours (not JSON, another
    kind, a newer version, too long); raises MalformedEvent for an event whose fields are not
    what its kind promises. Numbers come out finite: a NaN or infinite value where a number may
    be missing (eta_s, rate, a metric value, inside a result) is None."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", "replace")
    if len(line) > MAX_LINE:
        return None
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or obj.get("kind") not in KINDS:
        return None
    v = obj.pop("v", None)
    if not _is_int(v) or v > EVENTS_VERSION:
        return None
    kind = obj.pop("kind")
    t = _number(obj.pop("t", 0.0))
    cmd = obj.pop("cmd", "")
    return _DECODERS[kind](obj, t if t is not None else 0.0,
                           cmd[:MAX_WORD] if isinstance(cmd, str) else "")


def _progress(d: dict[str, Any], t: float, cmd: str) -> Progress:
    done, total, unit, desc = d.get("done"), d.get("total"), d.get("unit"), d.get("desc")
    _check(_count(done) is not None, "progress: done is not a number")
    _check(total is None or _count(total) is not None, "progress: total is not a number")
    _check(unit is None or isinstance(unit, str), "progress: unit is not a string")
    _check(desc is None or isinstance(desc, str), "progress: desc is not a string")
    return Progress(t, cmd, done=_count(done) or 0, total=_count(total),
                    unit=(unit or "")[:MAX_WORD], desc=(desc or "")[:MAX_WORD],
                    eta_s=_bounded(d.get("eta_s")), rate=_bounded(d.get("rate")))


def _metric(d: dict[str, Any], t: float, cmd: str) -> Metric:
    values, step, label = d.get("values"), d.get("step"), d.get("name")
    if not isinstance(values, dict):
        raise MalformedEvent("metric: values is not an object")
    _check(step is None or _count(step) is not None, "metric: step is not a number")
    _check(label is None or isinstance(label, str), "metric: name is not a string")
    kept: dict[str, float | int | None] = {}
    for name, x in list(values.items())[:MAX_VALUES]:
        _check(x is None or _is_number(x), f"metric: {str(name)[:40]!r} is not a number")
        kept[str(name)[:MAX_WORD]] = x if _is_int(x) and abs(x) <= 2 ** 53 else _number(x)
    return Metric(t, cmd, step=_count(step), values=kept, name=(label or "")[:MAX_WORD])


def _log(d: dict[str, Any], t: float, cmd: str) -> Log:
    level, msg = d.get("level", "info"), d.get("msg", "")
    _check(isinstance(level, str), "log: level is not a string")
    _check(isinstance(msg, str), "log: msg is not a string")
    return Log(t, cmd, level=level[:MAX_WORD], msg=msg[:MAX_TEXT])


def _result(d: dict[str, Any], t: float, cmd: str) -> Result:
    data = d.get("data", {})
    _check(isinstance(data, dict), "result: data is not an object")
    return Result(t, cmd, data=finite(data))


def _error(d: dict[str, Any], t: float, cmd: str) -> Error:
    msg, type_ = d.get("msg"), d.get("type", "")
    if not isinstance(msg, str):
        raise MalformedEvent("error: msg is not a string")
    _check(isinstance(type_, str), "error: type is not a string")
    return Error(t, cmd, msg=msg[:MAX_TEXT], type=type_[:MAX_WORD])


def _sample(d: dict[str, Any], t: float, cmd: str) -> Sample:
    return Sample(t, cmd, data=finite(d))


_DECODERS: dict[str, Callable[[dict[str, Any], float, str], Event]] = {
    "progress": _progress, "metric": _metric, "log": _log, "result": _result,
    "error": _error, "sample": _sample}


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise MalformedEvent(what)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _number(x: object) -> float | None:
    """A finite float, or None for anything else (NaN, infinity, a string, a bool)."""
    if not _is_number(x):
        return None
    try:
        f = float(x)  # type: ignore[arg-type]
    except OverflowError:   # an int too large for a float
        return None
    return f if math.isfinite(f) else None


def _count(x: object) -> int | None:
    """A whole count (0 .. 2**53), or None."""
    f = _number(x)
    return int(f) if f is not None and 0 <= f <= 2 ** 53 else None


def _bounded(x: object) -> float | None:
    """A duration or rate worth showing (finite, 0 .. MAX_SECONDS), or None."""
    f = _number(x)
    return f if f is not None and 0 <= f <= MAX_SECONDS else None


def _json_default(o: Any) -> Any:
    # numpy / torch scalars and paths end up here
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def drop_torn_tail(path: str) -> None:
    """Truncate a JSON-lines file after its last newline (a no-op when it ends with one)."""
    try:
        f = open(path, "r+b")  # noqa: SIM115
    except FileNotFoundError:
        return
    with f:
        size = f.seek(0, os.SEEK_END)
        pos = size
        while pos > 0:
            step = min(4096, pos)
            f.seek(pos - step)
            chunk = f.read(step)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                pos = pos - step + nl + 1
                break
            pos -= step
        if pos != size:
            f.truncate(pos)


class Emitter:
    """Where an engine command reports to: JSON lines with --events, a human view without.

    Human mode: progress (at most every 0.1 s) and logs go to stderr through
    engine/progress_bar.py; results are printed by the command itself. Extra sinks (e.g.
    RUN_DIR/events.jsonl) always receive JSON lines, whichever mode stdout is in.
    """

    def __init__(self, cmd: str, json_mode: bool = False, out: IO[str] | None = None,
                 err: IO[str] | None = None) -> None:
        self.cmd = cmd
        self.json_mode = json_mode
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.sinks: list[IO[str]] = []
        self._last_progress = 0.0
        self.bar = ProgressBar(self.err)
        self._progress_start: dict[str, tuple[float, int]] = {}
        # a thread beside the command's may report too (a trainer's relay of another rank's
        # wait): a line is written whole
        self._lock = threading.RLock()

    # -- sinks ---------------------------------------------------------------------------------
    def add_sink(self, path: str, append: bool = True) -> None:
        """Also write every event, as JSON, to this file (flushed per line).

        Appending after a writer that was killed mid-line first cuts that torn tail off, so the
        next event starts on a line of its own and every line stays one parseable event.
        """
        if append:
            drop_torn_tail(path)
        self.sinks.append(open(path, "a" if append else "w", encoding="utf-8"))  # noqa: SIM115

    def close(self) -> None:
        self.bar.end()
        for s in self.sinks:
            s.close()
        self.sinks.clear()

    def _emit(self, kind: str, payload: dict[str, Any]) -> str:
        line = encode(kind, self.cmd, payload)
        with self._lock:
            for s in self.sinks:
                s.write(line + "\n")
                s.flush()
            if self.json_mode:
                self.out.write(line + "\n")
                self.out.flush()
        return line

    # -- kinds ---------------------------------------------------------------------------------
    def progress(self, done: int, total: int | None = None, unit: str = "it", desc: str = "",
                 force: bool = False) -> None:
        now = time.monotonic()
        start = self._progress_start.get(desc)
        if start is None or done < start[1]:
            start = self._progress_start[desc] = (now, done)
        elapsed = now - start[0]
        rate = (done - start[1]) / elapsed if elapsed > 0 and done > start[1] else None
        eta = (total - done) / rate if rate and total is not None else None
        finished = total is not None and done >= total
        if not force and not finished and now - self._last_progress < 0.1:
            return  # throttle both views: a tight loop must not flood the stream
        self._last_progress = now
        payload = {"done": done, "total": total, "unit": unit, "desc": desc,
                   "eta_s": None if eta is None else round(eta, 1),
                   "rate": None if rate is None else round(rate, 3)}
        with self._lock:
            self._emit("progress", payload)
            if not self.json_mode:
                self.bar.draw(done, total, unit, desc, rate, eta)
                if finished:
                    self.bar.end()

    def metric(self, values: dict[str, Any], step: int | None = None, name: str = "") -> None:
        """One step's numbers (`name`: what they measure, when not the training step's); a
        value that is not finite (a diverged loss) is written as null, and a warning names it:
        the stream never holds NaN or infinity."""
        bad = {k: v for k, v in values.items() if finite(v) is None and v is not None}
        self._emit("metric", {"step": step, "values": finite(values),
                              **({"name": name} if name else {})})
        if bad:
            named = ", ".join(f"{k} = {v}" for k, v in bad.items())
            self.log(f"step {step}: {named} is not a finite number (recorded as null)",
                     level="warning")

    def log(self, msg: str, level: str = "info") -> None:
        with self._lock:
            self._emit("log", {"level": level, "msg": msg})
            if not self.json_mode:
                self.bar.line(("" if level == "info" else f"{level}: ") + msg)

    def result(self, data: dict[str, Any]) -> None:
        self._emit("result", {"data": data})

    def answer(self, data: dict[str, Any], as_json: bool, text: Callable[[dict[str, Any]], str],
               indent: int | None = 2) -> None:
        """A command's final answer: the result event, and for humans either the data as JSON
        (the command's --json) or text(data). With --events, stdout holds only the event."""
        self.result(data)
        if not self.json_mode:
            print(json.dumps(finite(data), indent=indent, default=_json_default, allow_nan=False)
                  if as_json else text(data),
                  file=self.out, flush=True)

    def error(self, msg: str, type_: str = "EngineError") -> None:
        self.bar.end()  # the CLI's `error:` line must not be glued to a half-drawn bar
        self._emit("error", {"msg": msg, "type": type_})

    def sample(self, data: dict[str, Any]) -> None:
        """One monitor-agent sample (engine/monitor.py documents the record)."""
        self._emit("sample", data)
