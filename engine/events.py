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
    log       level: "debug" | "info" | "warning" | "error", msg: str
    result    data: {...}   the command's final answer (same content as its --json output)
    error     msg: str (one line), type: str
    sample    gpus: [...], host: {...}   one monitor-agent sample (engine/monitor.py documents it)
This module has no heavy imports: the console imports it without torch.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

EVENTS_VERSION = 1
KINDS = ("progress", "metric", "log", "result", "error", "sample")


@dataclass(frozen=True)
class Event:
    """One parsed event line."""

    kind: str
    t: float
    cmd: str
    data: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)


def encode(kind: str, cmd: str, payload: dict[str, Any], t: float | None = None) -> str:
    """One event as a JSON line (no trailing newline)."""
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}")
    obj = {"v": EVENTS_VERSION, "kind": kind, "t": time.time() if t is None else t, "cmd": cmd}
    obj.update(payload)
    return json.dumps(obj, separators=(",", ":"), default=_json_default)


def parse(line: str | bytes) -> Event | None:
    """Parse one line; None for anything that is not an event we understand (never raises)."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", "replace")
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("kind") not in KINDS:
        return None
    v = obj.pop("v", None)
    if not isinstance(v, int) or v > EVENTS_VERSION:
        return None
    kind = obj.pop("kind")
    t = obj.pop("t", 0.0)
    cmd = obj.pop("cmd", "")
    t = float(t) if isinstance(t, (int, float)) else 0.0
    return Event(kind=kind, t=t, cmd=str(cmd), data=obj)


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

    Human mode: progress is a one-line bar on stderr (redrawn at most every 0.1 s) when stderr
    is a terminal, and whole lines (one per tenth done, or per 10 s) when it is a file or a pipe,
    never `\r`; logs go to stderr, results are printed by the command itself. Extra sinks (e.g.
    RUN_DIR/events.jsonl) always receive JSON lines, whichever mode stdout is in.
    """

    def __init__(self, cmd: str, json_mode: bool = False, out: IO[str] | None = None,
                 err: IO[str] | None = None) -> None:
        self.cmd = cmd
        self.json_mode = json_mode
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.sinks: list[IO[str]] = []
        self._last_bar = 0.0
        self._bar_open = False
        self._tty = _isatty(self.err)
        self._plain_last: dict[str, tuple[int | None, float]] = {}  # desc -> (tenth, time)
        self._progress_start: dict[str, tuple[float, int]] = {}

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
        self._end_bar()
        for s in self.sinks:
            s.close()
        self.sinks.clear()

    def _emit(self, kind: str, payload: dict[str, Any]) -> str:
        line = encode(kind, self.cmd, payload)
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
        if not force and not finished and now - self._last_bar < 0.1:
            return  # throttle both views: a tight loop must not flood the stream
        self._last_bar = now
        payload = {"done": done, "total": total, "unit": unit, "desc": desc,
                   "eta_s": None if eta is None else round(eta, 1),
                   "rate": None if rate is None else round(rate, 3)}
        self._emit("progress", payload)
        if not self.json_mode:
            self._draw_bar(done, total, unit, desc, rate, eta)
            if finished:
                self._end_bar()

    def metric(self, values: dict[str, Any], step: int | None = None) -> None:
        self._emit("metric", {"step": step, "values": values})

    def log(self, msg: str, level: str = "info") -> None:
        self._emit("log", {"level": level, "msg": msg})
        if not self.json_mode:
            self._end_bar()
            self.err.write(("" if level == "info" else f"{level}: ") + msg + "\n")
            self.err.flush()

    def result(self, data: dict[str, Any]) -> None:
        self._emit("result", {"data": data})

    def answer(self, data: dict[str, Any], as_json: bool, text: Callable[[dict[str, Any]], str],
               indent: int | None = 2) -> None:
        """A command's final answer: the result event, and for humans either the data as JSON
        (the command's --json) or text(data). With --events, stdout holds only the event."""
        self.result(data)
        if not self.json_mode:
            print(json.dumps(data, indent=indent, default=_json_default) if as_json else text(data),
                  file=self.out, flush=True)

    def error(self, msg: str, type_: str = "EngineError") -> None:
        self._end_bar()  # the CLI's `error:` line must not be glued to a half-drawn bar
        self._emit("error", {"msg": msg, "type": type_})

    def sample(self, data: dict[str, Any]) -> None:
        """One monitor-agent sample (engine/monitor.py documents the record)."""
        self._emit("sample", data)

    # -- human progress bar ----------------------------------------------------------------------
    def _draw_bar(self, done: int, total: int | None, unit: str, desc: str,
                  rate: float | None, eta: float | None) -> None:
        if total:
            frac = min(1.0, done / total)
            width = 30
            fill = int(frac * width)
            bar = "#" * fill + "-" * (width - fill)
            text = f"{desc} [{bar}] {done}/{total} {unit} {frac * 100:5.1f}%"
        else:
            text = f"{desc} {done} {unit}"
        if rate:
            text += f" {rate:.1f} {unit}/s"
        if eta is not None:
            text += f" eta {_fmt_secs(eta)}"
        if not self._tty:   # a log file or a pipe: a few whole lines, no carriage returns
            tenth = int(min(1.0, done / total) * 10) if total else None
            last = self._plain_last.get(desc)
            now = time.monotonic()
            if last is None or (tenth is not None and tenth != last[0]) or now - last[1] >= 10:
                self._plain_last[desc] = (tenth, now)
                self.err.write(text[:150] + "\n")
                self.err.flush()
            return
        self.err.write("\r" + text[:150].ljust(60))
        self.err.flush()
        self._bar_open = True

    def _end_bar(self) -> None:
        if self._bar_open:
            self.err.write("\n")
            self.err.flush()
            self._bar_open = False


def _isatty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):   # no isatty, or closed
        return False


def _fmt_secs(s: float) -> str:
    s = int(s)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"
