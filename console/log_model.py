"""What the logs pane shows, without Textual: the last MAX_LINES lines of a followed log, the vLLM
metrics parsed from them (console/vllm_log.py), a filter and error positions.

Lines arrive in batches from a LogFollower; each gets a sequence number, so positions stay valid
while old lines fall off the front. Memory is bounded whatever the log's size or rate: the lines
deque, the metrics deques and the filter's match list all have fixed maximum lengths.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

from console.follow import Line
from console.vllm_log import EngineStats, SpecDecodeStats, parse_line, strip_ansi

MAX_LINES = 20_000
MAX_POINTS = 1_000       # metric lines kept (at vLLM's 10 s interval: about 2.8 hours)
ERROR = re.compile(r"\b(?:ERROR|CRITICAL|FATAL)\b|Traceback \(most recent call last\)"
                   r"|CUDA out of memory|\b\w+Error: ")
WARNING = re.compile(r"\bWARN(?:ING)?\b")


_HINTS = ("ERR", "Err", "CRIT", "FATAL", "Traceback", "out of memory", "WARN")


class LogEntry(NamedTuple):
    """One line as the pane keeps it: sequence number, byte offset, text without colours, and
    its severity ("error", "warning" or "")."""

    seq: int
    offset: int
    text: str
    level: str = ""


def severity(text: str) -> str:
    """"error", "warning" or "" for a line (a substring check first: most lines have neither)."""
    if not any(h in text for h in _HINTS):
        return ""
    if ERROR.search(text):
        return "error"
    if WARNING.search(text):
        return "warning"
    return ""


class LogModel:
    """The followed log's recent lines, its vLLM metrics and the current filter."""

    def __init__(self, max_lines: int = MAX_LINES, max_points: int = MAX_POINTS) -> None:
        self.lines: deque[LogEntry] = deque(maxlen=max_lines)
        self.engine: deque[EngineStats] = deque(maxlen=max_points)
        self.spec: deque[SpecDecodeStats] = deque(maxlen=max_points)
        self.next_seq = 0
        self.total = 0                  # lines seen since the start (not only those kept)
        self.errors = 0                 # error lines seen
        self.query = ""
        self._query_lower = ""
        self.matches: deque[int] = deque(maxlen=max_lines)  # seqs of lines matching the query
        self.version = 0                # bumps per batch: the pane redraws at most once a tick

    # -- input ----------------------------------------------------------------------------------
    def add(self, batch: Iterable[Line]) -> None:
        q = self._query_lower
        for line in batch:
            text = strip_ansi(line.text) if "\x1b" in line.text else line.text
            level = severity(text)
            entry = LogEntry(self.next_seq, line.offset, text, level)
            self.next_seq += 1
            self.lines.append(entry)
            if q and q in text.lower():
                self.matches.append(entry.seq)
            if level == "error":
                self.errors += 1
            m = parse_line(text)
            if isinstance(m, EngineStats):
                self.engine.append(m)
            elif isinstance(m, SpecDecodeStats):
                self.spec.append(m)
            self.total += 1
        self.version += 1

    def clear(self) -> None:
        """Forget every line and metric (another file is followed now); the query stays."""
        for d in (self.lines, self.engine, self.spec, self.matches):
            d.clear()
        self.total = self.errors = 0
        self.version += 1

    # -- positions ------------------------------------------------------------------------------
    @property
    def first_seq(self) -> int:
        return self.lines[0].seq if self.lines else self.next_seq

    def entry(self, seq: int) -> LogEntry | None:
        i = seq - self.first_seq
        return self.lines[i] if 0 <= i < len(self.lines) else None

    def visible(self) -> int:
        """How many lines the view shows (all kept lines, or the matches when filtering)."""
        self._prune()
        return len(self.matches) if self.query else len(self.lines)

    def at(self, row: int) -> LogEntry | None:
        """The entry on view row `row`."""
        if self.query:
            return self.entry(self.matches[row]) if 0 <= row < len(self.matches) else None
        return self.lines[row] if 0 <= row < len(self.lines) else None

    def row_of(self, seq: int) -> int | None:
        """The view row of a sequence number (None when filtered out or dropped)."""
        if self.query:
            for i, s in enumerate(self.matches):
                if s == seq:
                    return i
            return None
        i = seq - self.first_seq
        return i if 0 <= i < len(self.lines) else None

    def _prune(self) -> None:
        first = self.first_seq
        while self.matches and self.matches[0] < first:
            self.matches.popleft()

    # -- filter and errors -------------------------------------------------------------------
    def set_query(self, query: str) -> None:
        """Show only lines containing query (case-insensitive); "" shows everything."""
        self.query, self._query_lower = query, query.lower()
        self.matches.clear()
        if query:
            self.matches.extend(e.seq for e in self.lines if self._query_lower in e.text.lower())
        self.version += 1

    def find_error(self, from_row: int, direction: int) -> int | None:
        """The view row of the nearest error line after (direction 1) or before (-1) from_row."""
        n = self.visible()
        row = from_row + direction
        while 0 <= row < n:
            e = self.at(row)
            if e is not None and e.level == "error":
                return row
            row += direction
        return None
