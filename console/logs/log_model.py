"""What the logs pane shows, without Textual: the last MAX_LINES lines of a followed log, the vLLM
metrics parsed from them (console/logs/vllm_log.py), a filter and error positions.

Lines arrive in batches from a LogFollower; each gets a sequence number, so positions stay valid
while old lines fall off the front. Memory is bounded whatever the log's size or rate: the lines
deque, the metrics deques and the filter's match list all have fixed maximum lengths.

A busy log brings a thousand lines a second and nearly all of them are plain text, so a batch is
taken in whole: its texts go into the deque as they are, and only the few lines that can matter
(a severity hint, a metrics marker, a filter match), found by substring searches over the batch,
get any per-line work. Entries (`LogEntry`) are made when asked for.

Texts are kept as a terminal would show them (`terminal_text`): a progress bar's carriage
returns overwrite (tqdm's `\rLoading ... 100%`), other control characters become `^X`
(console/text.py, shared with the subcommands and the TUI's host text); sent to
the screen as they are, they moved the cursor and drew over the rest of the console.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple, overload

from console.logs.follow import Line, LineBatch
from console.logs.vllm_log import MARKERS, EngineStats, SpecDecodeStats, parse_line, strip_ansi
from console.text import CONTROL, terminal_text

MAX_LINES = 20_000
MAX_POINTS = 1_000       # metric lines kept (at vLLM's 10 s interval: about 2.8 hours)
ERROR = re.compile(r"\b(?:ERROR|CRITICAL|FATAL)\b|Traceback \(most recent call last\)"
                   r"|CUDA out of memory|\b\w+Error: ")
WARNING = re.compile(r"\bWARN(?:ING)?\b")
#: a logger's own level word, looked for in the first LEVEL_SPAN characters of a line
LEVEL = re.compile(r"\b(DEBUG|INFO|WARN(?:ING)?|ERROR|CRITICAL|FATAL)\b")
LEVEL_SPAN = 60


_HINTS = ("ERR", "Err", "CRIT", "FATAL", "Traceback", "out of memory", "WARN")


class LogEntry(NamedTuple):
    """One line as the pane keeps it: sequence number, byte offset, text without colours, and
    its severity ("error", "warning" or "")."""

    seq: int
    offset: int
    text: str
    level: str = ""


def severity(text: str) -> str:
    """"error", "warning" or "" for a line (a substring check first: most lines have neither).
    A line that carries its logger's level near its start is that level, whatever it quotes (a
    vLLM WARNING that mentions `OSError: [Errno 24]` is a warning); the rest (a traceback's
    lines, `XError: ...`) are judged by what they say."""
    if not any(h in text for h in _HINTS):
        return ""
    own = LEVEL.search(text[:LEVEL_SPAN])
    if own is not None:
        word = own.group(1)
        return "error" if word in ("ERROR", "CRITICAL", "FATAL") else \
            "warning" if word.startswith("WARN") else ""
    if ERROR.search(text):
        return "error"
    if WARNING.search(text):
        return "warning"
    return ""


def lines_containing(blob: str, needles: Iterable[str]) -> list[int]:
    """Indexes (ascending) of the "\n"-separated lines of blob that contain any of needles."""
    hits: set[int] = set()
    for needle in needles:
        i = blob.find(needle)
        while i >= 0:
            hits.add(i)
            i = blob.find("\n", i)  # one hit per line is enough
            if i < 0:
                break
            i = blob.find(needle, i)
    rows: list[int] = []
    row = last = 0
    for pos in sorted(hits):
        row += blob.count("\n", last, pos)
        last = pos
        if not rows or rows[-1] != row:
            rows.append(row)
    return rows


class _Lines(Sequence[LogEntry]):
    """The kept lines as LogEntry values, made on access (oldest first)."""

    def __init__(self, model: LogModel) -> None:
        self._m = model

    def __len__(self) -> int:
        return len(self._m._texts)

    @overload
    def __getitem__(self, i: int) -> LogEntry: ...
    @overload
    def __getitem__(self, i: slice) -> list[LogEntry]: ...

    def __getitem__(self, i: int | slice) -> LogEntry | list[LogEntry]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        return self._m._entry_at(i)

    def __iter__(self) -> Iterator[LogEntry]:
        m = self._m
        levels = m._levels
        for seq, (offset, text) in enumerate(zip(m._offsets, m._texts, strict=True),
                                              m.first_seq):
            yield LogEntry(seq, offset, text, levels.get(seq, ""))


class LogModel:
    """The followed log's recent lines, its vLLM metrics and the current filter."""

    def __init__(self, max_lines: int = MAX_LINES, max_points: int = MAX_POINTS) -> None:
        # the kept lines, column-wise: texts and byte offsets; severities only where there is one
        self._texts: deque[str] = deque(maxlen=max_lines)
        self._offsets: deque[int] = deque(maxlen=max_lines)
        self._levels: dict[int, str] = {}          # seq -> "error" / "warning"
        self._level_seqs: deque[int] = deque()     # the keys of _levels, oldest first
        self.lines: Sequence[LogEntry] = _Lines(self)
        self.engine: deque[EngineStats] = deque(maxlen=max_points)
        self.spec: deque[SpecDecodeStats] = deque(maxlen=max_points)
        self.next_seq = 0
        self.total = 0                  # lines seen since the start (not only those kept)
        self.errors = 0                 # error lines seen
        self.query = ""
        self._query_lower = ""
        self.matches: deque[int] = deque(maxlen=max_lines)  # seqs of lines matching the query
        self.widest = 0                 # the longest line's length: how far the view pans
        self.version = 0                # bumps per batch: the pane redraws at most once a tick

    # -- input ----------------------------------------------------------------------------------
    def add(self, batch: Iterable[Line]) -> None:
        if isinstance(batch, LineBatch):
            offsets, texts = batch.columns()
        else:
            got = list(batch)
            offsets, texts = [ln.offset for ln in got], [ln.text for ln in got]
        blob = "\n".join(texts)
        if "\x1b" in blob:
            for row in lines_containing(blob, ["\x1b"]):
                texts[row] = strip_ansi(texts[row])
            blob = "\n".join(texts)
        if CONTROL.search(blob):
            texts = [terminal_text(t) if CONTROL.search(t) else t for t in texts]
            blob = "\n".join(texts)
        seq0 = self.next_seq
        for row in lines_containing(blob, _HINTS):
            level = severity(texts[row])
            if level:
                self._levels[seq0 + row] = level
                self._level_seqs.append(seq0 + row)
                self.errors += level == "error"
        for row in lines_containing(blob, MARKERS):
            m = parse_line(texts[row])
            if isinstance(m, EngineStats):
                self.engine.append(m)
            elif isinstance(m, SpecDecodeStats):
                self.spec.append(m)
        if self._query_lower:  # lower() keeps the newlines, so rows still count right
            self.matches.extend(seq0 + row for row in
                                lines_containing(blob.lower(), [self._query_lower]))
        self._texts.extend(texts)
        self._offsets.extend(offsets)
        self.widest = max(self.widest, max(map(len, texts), default=0))
        self.next_seq += len(texts)
        self.total += len(texts)
        first = self.first_seq
        while self._level_seqs and self._level_seqs[0] < first:
            del self._levels[self._level_seqs.popleft()]
        self.version += 1

    def clear(self) -> None:
        """Forget every line and metric (another file is followed now); the query stays."""
        for d in (self._texts, self._offsets, self._level_seqs, self.engine, self.spec,
                  self.matches):
            d.clear()
        self._levels.clear()
        self.total = self.errors = self.widest = 0
        self.version += 1

    def new_series(self) -> None:
        """The log restarted (truncated: a new server writes it from byte 0): the charts start
        again from its lines, not on from the old server's figures; the text stays."""
        self.engine.clear()
        self.spec.clear()
        self.version += 1

    # -- positions ------------------------------------------------------------------------------
    @property
    def first_seq(self) -> int:
        return self.next_seq - len(self._texts)

    def _entry_at(self, i: int) -> LogEntry:
        seq = self.first_seq + i
        return LogEntry(seq, self._offsets[i], self._texts[i], self._levels.get(seq, ""))

    def entry(self, seq: int) -> LogEntry | None:
        i = seq - self.first_seq
        return self._entry_at(i) if 0 <= i < len(self._texts) else None

    def visible(self) -> int:
        """How many lines the view shows (all kept lines, or the matches when filtering)."""
        self._prune()
        return len(self.matches) if self.query else len(self._texts)

    def at(self, row: int) -> LogEntry | None:
        """The entry on view row `row`."""
        if self.query:
            return self.entry(self.matches[row]) if 0 <= row < len(self.matches) else None
        return self._entry_at(row) if 0 <= row < len(self._texts) else None

    def row_of(self, seq: int) -> int | None:
        """The view row of a sequence number (None when filtered out or dropped)."""
        if self.query:
            for i, s in enumerate(self.matches):
                if s == seq:
                    return i
            return None
        i = seq - self.first_seq
        return i if 0 <= i < len(self._texts) else None

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
            q = self._query_lower
            self.matches.extend(seq for seq, text in enumerate(self._texts, self.first_seq)
                                if q in text.lower())
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
