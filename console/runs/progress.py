"""What a run's event stream has said so far: progress, metric series, log lines, the outcome.

Pure state, no I/O: console/runs/watch.py feeds it the lines of a run's `events.jsonl` and
`output.log`; the run detail screen renders it. Memory stays bounded however long the run is:
a series keeps at most MAX_POINTS points (when full, every other point is dropped and only every
2nd, 4th, ... new step is kept, so the whole run stays in view at a coarser grain; the latest
value is always kept apart), and the log keeps the last MAX_LINES lines.

A resumed run (console/runs/service.py resume_run) appends its next attempt to the same files.
The record's attempt starts (`set_attempts`) put a marker line in the log before the first event
of each later attempt and clear the rate and ETA the earlier attempt left; a training step at or
below one already plotted (the attempt went on from its last checkpoint) drops the plotted points
from that step on, so each series reads by step, the resumed attempt continuing the line.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from console.runs.stream_figures import StreamFigures
from engine import events

MAX_POINTS = 2000
MAX_LINES = 500
#: metric names plotted: the weighted loss, the estimated acceptance length, acc_i per TTT step
PLOTTED = re.compile(r"^(loss|tau|acc_\d+)$")
#: the trainer's checkpoint line: the acceptance length measured on held-out samples, kept as
#: the series HELD_OUT beside `tau` (which is estimated on each training batch)
HELD_OUT_LOG = re.compile(r"checkpoint step_0*(\d+) \(held-out tau (\d+(?:\.\d+)?)\)")
HELD_OUT = "tau_held_out"
#: the acceptance length a running vLLM measured on each checkpoint (train --eval-server: the
#: metric events named events.SERVED), kept as this series
SERVED = "tau_served"


@dataclass
class Series:
    """(step, value) points of one metric, decimated to stay under MAX_POINTS."""

    points: list[tuple[float, float]] = field(default_factory=list)
    stride: int = 1
    seen: int = 0
    last: tuple[float, float] | None = None

    def cut(self, step: float) -> None:
        """Forget the points at `step` and after (a resumed attempt computes them again)."""
        self.points = [p for p in self.points if p[0] < step]
        if self.last is not None and self.last[0] >= step:
            self.last = self.points[-1] if self.points else None

    def add(self, step: float, value: float) -> None:
        self.last = (step, value)
        if self.seen % self.stride == 0:
            self.points.append((step, value))
            if len(self.points) > MAX_POINTS:
                self.points = self.points[::2]
                self.stride *= 2
        self.seen += 1

    def view(self) -> list[tuple[float, float]]:
        """The kept points plus the latest one (what a plot draws)."""
        if self.last is not None and (not self.points or self.points[-1] != self.last):
            return [*self.points, self.last]
        return list(self.points)


@dataclass
class LogLine:
    """One line shown in the run's log view."""

    t: float | None
    level: str          # info, warning, error, debug, or "out" for a plain output.log line
    text: str


class RunProgress:
    """The run as its events describe it (see the module docstring)."""

    def __init__(self) -> None:
        self.done: int | None = None
        self.total: int | None = None
        self.unit = ""
        self.desc = ""
        self.eta_s: float | None = None
        self.rate: float | None = None
        self.progress_t: float | None = None
        self.first_t: float | None = None
        self.series: dict[str, Series] = {}
        self.last_metrics: dict[str, float | int | None] = {}
        self.last_step: int | None = None
        self.lines: deque[LogLine] = deque(maxlen=MAX_LINES)
        self.result: dict[str, Any] | None = None
        self.error: str | None = None
        self.events = 0
        self.version = 0     # bumped on every change: widgets redraw only when it moved
        self.attempt_starts: list[float] = []   # when each attempt after the first started
        self.attempt = 1     # the attempt whose events came last
        self.stream = StreamFigures()   # a streamed run's pool, waits and tokens per second

    # -- feeding -----------------------------------------------------------------------------
    def ingest_event_line(self, text: str) -> None:
        """One line of events.jsonl (anything that is not an event is kept as output)."""
        ev = events.parse(text)
        if ev is None:
            if text.strip():
                self.add_output(text)
            return
        self.ingest(ev)

    def add_output(self, text: str) -> None:
        """One line of output.log (stderr of an engine run, everything of a plain command)."""
        self.lines.append(LogLine(None, "out", text))
        self.version += 1

    def set_attempts(self, starts: list[float]) -> None:
        """The start times of the attempts after the first (from the run's record)."""
        self.attempt_starts = sorted(starts)

    def _next_attempt(self, t: float) -> None:
        """A marker before the first event of each attempt that started by `t`."""
        while self.attempt <= len(self.attempt_starts) and \
                t >= self.attempt_starts[self.attempt - 1]:
            self.attempt += 1
            self.lines.append(LogLine(self.attempt_starts[self.attempt - 2], "mark",
                                      f"── attempt {self.attempt}: resumed ──"))
            self.eta_s = self.rate = None   # the last attempt's: none until this one has its own

    def ingest(self, ev: events.Event) -> None:
        self.events += 1
        if ev.t:
            self._next_attempt(ev.t)
        if self.first_t is None and ev.t:
            self.first_t = ev.t
        if isinstance(ev, events.Progress):
            self._progress(ev)
        elif isinstance(ev, events.Metric):
            self._metric(ev)
        elif isinstance(ev, events.Log):
            self.lines.append(LogLine(ev.t, ev.level, ev.msg))
            held = HELD_OUT_LOG.search(ev.msg)
            if held:
                self.series.setdefault(HELD_OUT, Series()).add(float(held[1]), float(held[2]))
        elif isinstance(ev, events.Result):
            self.result = dict(ev.data)
        elif isinstance(ev, events.Error):
            self.error = ev.msg or "failed without a message"
            self.lines.append(LogLine(ev.t, "error", self.error))
        self.version += 1

    def _progress(self, ev: events.Progress) -> None:
        self.done, self.total = ev.done, ev.total
        self.unit, self.desc = ev.unit, ev.desc
        self.eta_s, self.rate = ev.eta_s, ev.rate
        self.progress_t = ev.t

    def _metric(self, ev: events.Metric) -> None:
        if self.stream.ingest(ev):   # a stream's producer or trainer figures
            return
        if ev.name:  # not a training step's numbers: the step's own stay as they were
            tau = ev.values.get("acceptance_length")
            if ev.name == events.SERVED and ev.step is not None and tau is not None:
                self.series.setdefault(SERVED, Series()).add(float(ev.step), float(tau))
            return
        step = ev.step if ev.step is not None else (self.last_step or 0) + 1
        if self.last_step is not None and step <= self.last_step:   # a resumed attempt
            for series in self.series.values():
                series.cut(float(step))
        self.last_step = step
        self.last_metrics = dict(ev.values)
        for name, v in ev.values.items():
            if v is not None and PLOTTED.match(name):   # None: not finite, a gap in the plot
                self.series.setdefault(name, Series()).add(float(step), float(v))

    # -- reading -----------------------------------------------------------------------------
    @property
    def fraction(self) -> float | None:
        if self.done is None or not self.total:
            return None
        return max(0.0, min(1.0, self.done / self.total))

    def acc_names(self) -> list[str]:
        """acc_0, acc_1, ... in TTT-step order."""
        return sorted((n for n in self.series if n.startswith("acc_")),
                      key=lambda n: int(n.split("_")[1]))

    def points(self, name: str) -> list[tuple[float, float]]:
        s = self.series.get(name)
        return s.view() if s else []
