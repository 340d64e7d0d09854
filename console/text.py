"""A host's text as a terminal may show it: control characters made visible (standard library).

What a host sends (log lines, run ids, paths, stderr) can hold escape sequences: OSC 52 writes
the user's clipboard, OSC 0 the window title, `ESC[2J` clears the screen. Written raw to a
terminal, or drawn raw by the TUI, they act instead of showing. Here every control character but
newline and tab is shown as `^X` (C0 and DEL) or `\\xNN` (C1, which some terminals act on too).
The Logs pane's model, the TUI's host text (console/ui/host_text.py) and the subcommands'
stdout and stderr (`TerminalText`, set by console/cli.py) all use these functions.
"""

from __future__ import annotations

import io
import re
from typing import TextIO

#: control characters but the newline (the batch separator) and tab (expanded when drawn)
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _shown(m: re.Match[str]) -> str:
    c = ord(m[0])
    return "^?" if c == 0x7F else f"\\x{c:02x}" if c > 0x7F else "^" + chr(c + 64)


def visible(text: str) -> str:
    """Every control character but newline and tab as `^X` / `\\xNN` (a carriage return too)."""
    return CONTROL.sub(_shown, text) if CONTROL.search(text) else text


def terminal_text(text: str) -> str:
    """text as a terminal shows it: each carriage return starts overwriting from the left (a
    trailing one, as in CRLF line ends, changes nothing), other controls as `^X`."""
    if "\r" in text:
        shown = ""
        for part in text.rstrip("\r").split("\r"):
            shown = part + shown[len(part):]
        text = shown
    return visible(text)


class TerminalText(io.TextIOBase):
    """A subcommand's stdout or stderr: what is written goes out through `visible`, so a host's
    escapes reach the terminal as text. One carriage return at the start of a write is kept:
    it is a progress line redrawn in place (push, convert), written by the console itself.
    JSON output is unchanged (json.dumps escapes every control character itself)."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream

    def write(self, s: str) -> int:
        lead = "\r" if s.startswith("\r") else ""
        self.stream.write(lead + visible(s[len(lead):]))
        return len(s)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")
