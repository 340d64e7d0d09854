"""The human view of an engine command's progress and logs on stderr (the Emitter's, without
--events).

On a terminal, progress is one line redrawn in place with `\\r`; on a file or a pipe (a run's
stderr log) it is whole lines, one per tenth done or per 10 s, so a log never holds carriage
returns. A log line first ends a half-drawn bar, so the two never share a line.
"""

from __future__ import annotations

import time
from typing import IO

#: a progress line is cut to this many characters
WIDTH = 150


class ProgressBar:
    def __init__(self, err: IO[str]) -> None:
        self.err = err
        self.tty = _isatty(err)
        self._open = False
        self._plain_last: dict[str, tuple[int | None, float]] = {}  # desc -> (tenth, time)

    def draw(self, done: int, total: int | None, unit: str, desc: str,
             rate: float | None, eta: float | None) -> None:
        text = bar_text(done, total, unit, desc, rate, eta)
        if not self.tty:   # a log file or a pipe: a few whole lines, no carriage returns
            tenth = int(min(1.0, done / total) * 10) if total else None
            last = self._plain_last.get(desc)
            now = time.monotonic()
            if last is None or (tenth is not None and tenth != last[0]) or now - last[1] >= 10:
                self._plain_last[desc] = (tenth, now)
                self.err.write(text[:WIDTH] + "\n")
                self.err.flush()
            return
        self.err.write("\r" + text[:WIDTH].ljust(60))
        self.err.flush()
        self._open = True

    def line(self, text: str) -> None:
        """One whole line (a log message), below the bar."""
        self.end()
        self.err.write(text + "\n")
        self.err.flush()

    def end(self) -> None:
        """Finish a bar drawn in place, so what follows starts on a line of its own."""
        if self._open:
            self.err.write("\n")
            self.err.flush()
            self._open = False


def bar_text(done: int, total: int | None, unit: str, desc: str, rate: float | None,
             eta: float | None) -> str:
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
        text += f" eta {fmt_secs(eta)}"
    return text


def fmt_secs(s: float) -> str:
    s = int(s)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def _isatty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):   # no isatty, or closed
        return False
