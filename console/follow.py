"""Follow a file on a host by byte offset: no line lost or repeated across dropped connections.

`LogFollower` reads new bytes with `Transport.read_range` (SFTP on an SSH host), so all it
needs to resume is the offset of the next byte; after a dropped link it reconnects with backoff
and reads on from there. Only whole lines are handed out (an unfinished last line waits in a
bounded buffer), in batches: one list per read, which is what a high-rate consumer (the logs
pane, the metrics parser) wants.

Truncation and rotation: every read starts a few bytes before the offset and checks that those
bytes are still the ones already read (an inode change is checked too where the transport
reports inodes). When they are not, the file was truncated or replaced: the rest of the old
file is drained from `PATH.1` when that is where it went (logrotate's rename and copytruncate),
then the new file is read from its start. Invalid UTF-8 is replaced, never fatal; ANSI colour
codes are kept in `Line.text` and stripped by `Line.plain`; `Line.display()` cuts very long
lines for the screen only. Memory: one read chunk plus one unfinished line, whatever the file.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import NamedTuple, TypeVar

from console.errors import CommandFailed, TransportError
from console.transport.base import Transport
from console.vllm_log import strip_ansi

#: bytes per read: large enough that one round trip carries many thousands of lines
CHUNK = 4 * 1024 * 1024
#: a line longer than this (bytes) is handed out in pieces of this size (memory bound)
MAX_LINE = 1024 * 1024
#: what `Line.display()` keeps of a line
DISPLAY_LIMIT = 2000
#: bytes before the offset re-read on every poll to notice a replaced or truncated file
FINGERPRINT = 64
BACKOFF_FIRST, BACKOFF_MAX = 0.2, 5.0

T = TypeVar("T")


class Line(NamedTuple):
    """One line of the file: the byte offset where it starts and its text (no newline)."""

    offset: int
    text: str

    @property
    def plain(self) -> str:
        """The text without ANSI escape codes (what parsers match)."""
        return strip_ansi(self.text)

    def display(self, limit: int = DISPLAY_LIMIT) -> str:
        """The text cut to `limit` characters for the screen (parsers use `text`)."""
        if len(self.text) <= limit:
            return self.text
        return self.text[:limit] + f"… [{len(self.text) - limit} more chars]"


Notice = Callable[[str, str], None]    # (kind, detail): reconnecting, reconnected, truncated, ...


class LogFollower:
    """Yield the lines of a host file, from a start point, following it as it grows."""

    def __init__(self, transport: Transport, path: str, *, start: int | str = "end",
                 tail_lines: int | None = None, follow: bool = True, poll: float = 0.25,
                 chunk: int = CHUNK, on_notice: Notice | None = None,
                 until: Callable[[], Awaitable[bool]] | None = None) -> None:
        """start: a byte offset, "begin" or "end"; tail_lines: begin at the last N lines instead.
        follow=False stops at the end of the file. `until` is asked whenever the follower is
        idle at the end of the file; once it says True, the follower drains and stops."""
        self.transport = transport
        self.path = path
        self.follow = follow
        self.poll = poll
        self.chunk = chunk
        self.on_notice = on_notice
        self.until = until
        self.offset = 0                       # next byte to read
        self._start = start
        self._tail_lines = tail_lines
        self._partial = b""                   # bytes read past the last newline
        self._partial_at = 0                  # offset of _partial's first byte
        self._finger = b""                    # the FINGERPRINT bytes before self.offset
        self._inode = 0
        self._stopped = False
        self.lines_read = 0
        self.bytes_read = 0

    def stop(self) -> None:
        """End `batches()` at its next turn."""
        self._stopped = True

    def _notice(self, kind: str, detail: str = "") -> None:
        if self.on_notice is not None:
            self.on_notice(kind, detail)

    # -- the loop ------------------------------------------------------------------------------

    async def lines(self) -> AsyncIterator[Line]:
        async for batch in self.batches():
            for line in batch:
                yield line

    async def batches(self) -> AsyncIterator[list[Line]]:
        """Lists of whole lines, in file order, as they appear. Ends at EOF unless following."""
        await self._retrying(self._position)
        finishing = False
        while not self._stopped:
            batch = await self._retrying(self._read_once)
            if batch is None:                  # idle at the end of the file
                if not self.follow or finishing:
                    break
                if self.until is not None and await self._retrying(self.until):
                    finishing = True           # one more read for what came just before the end
                    continue
                await asyncio.sleep(self.poll)
                continue
            finishing = False
            if batch:
                self.lines_read += len(batch)
                yield batch
        if self._partial and not self._stopped:  # an unterminated last line at the very end
            yield [self._flush_partial()]

    async def _retrying(self, op: Callable[[], Awaitable[T]]) -> T:
        """op(), retried with backoff across dropped connections (the offset is unchanged)."""
        delay, failing = BACKOFF_FIRST, False
        while True:
            try:
                result = await op()
            except TransportError as e:
                # a failed command on a live link is a real error; on a dead one, a drop
                if isinstance(e, CommandFailed) and self.transport.connected:
                    raise
                if not failing:
                    self._notice("reconnecting", str(e))
                failing = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            if failing:
                self._notice("reconnected", f"resuming at byte {self.offset}")
            return result

    # -- positioning ---------------------------------------------------------------------------

    async def _position(self) -> None:
        st = await self.transport.stat(self.path)
        size = st.size if st else 0
        self._inode = st.inode if st else 0
        if self._tail_lines is not None:
            offset = await self._last_lines_offset(size, self._tail_lines)
        elif self._start == "begin":
            offset = 0
        elif self._start == "end":
            offset = size
        else:
            offset = min(int(self._start), size)
        await self._seek(offset)

    async def _seek(self, offset: int) -> None:
        self.offset = self._partial_at = offset
        self._partial = b""
        lo = max(0, offset - FINGERPRINT)
        self._finger = await self.transport.read_range(self.path, lo, offset - lo) if offset else b""

    async def _last_lines_offset(self, size: int, n: int) -> int:
        """Offset where the last n lines start, reading backwards in blocks (bounded)."""
        if n <= 0 or size == 0:
            return size
        pos, seen, block = size, 0, 64 * 1024
        # a final newline ends the last line; it does not start a new one
        tail = await self.transport.read_range(self.path, size - 1, 1)
        skip_last = tail == b"\n"
        while pos > 0:
            lo = max(0, pos - block)
            data = await self.transport.read_range(self.path, lo, pos - lo)
            end = len(data) - 1 if (skip_last and pos == size) else len(data)
            idx = end
            while True:
                idx = data.rfind(b"\n", 0, idx)
                if idx < 0:
                    break
                seen += 1
                if seen == n:
                    return lo + idx + 1
            pos = lo
        return 0

    # -- reading -------------------------------------------------------------------------------

    async def _read_once(self) -> list[Line] | None:
        """One read: the lines it completed ([] if none yet), None at the end of the file."""
        k = len(self._finger)
        try:
            data = await self.transport.read_range(self.path, self.offset - k, k + self.chunk)
        except CommandFailed:
            if not self.transport.connected:
                raise
            if await self.transport.stat(self.path) is None:
                return None                   # gone (mid-rotation) or not created yet: wait
            raise
        if data[:k] != self._finger:
            return await self._replaced(len(data) < k)
        new = data[k:]
        if not new:
            st = await self.transport.stat(self.path)
            if st is not None and st.inode and self._inode and st.inode != self._inode:
                return await self._replaced(False)
            if st is not None:
                self._inode = st.inode
            return None
        return self._take(new)

    def _take(self, new: bytes) -> list[Line]:
        self.offset += len(new)
        self.bytes_read += len(new)
        self._finger = (self._finger + new)[-FINGERPRINT:]
        buf = self._partial + new if self._partial else new
        parts = buf.split(b"\n")
        rest = parts.pop()
        off = self._partial_at
        out: list[Line] = []
        append = out.append
        for raw in parts:
            n = len(raw)
            if n > MAX_LINE:
                for i in range(0, n - MAX_LINE, MAX_LINE):
                    append(Line(off + i, raw[i:i + MAX_LINE].decode("utf-8", "replace")))
                i = (n - 1) // MAX_LINE * MAX_LINE
                append(Line(off + i, raw[i:].rstrip(b"\r").decode("utf-8", "replace")))
            elif raw[-1:] == b"\r":
                append(Line(off, raw[:-1].decode("utf-8", "replace")))
            else:
                append(Line(off, raw.decode("utf-8", "replace")))
            off += n + 1
        self._partial, self._partial_at = rest, off
        while len(self._partial) > MAX_LINE:  # a newline-free flood: hand it out in pieces
            piece, self._partial = self._partial[:MAX_LINE], self._partial[MAX_LINE:]
            out.append(Line(self._partial_at, piece.decode("utf-8", "replace")))
            self._partial_at += len(piece)
        return out

    def _flush_partial(self) -> Line:
        line = Line(self._partial_at, self._partial.decode("utf-8", "replace").rstrip("\r"))
        self._partial_at += len(self._partial)
        self._partial = b""
        return line

    async def _replaced(self, shorter: bool) -> list[Line]:
        """The file is not the one we were reading: drain the old one's rest, restart at 0."""
        out = await self._drain_rotated()
        if self._partial:
            out.append(self._flush_partial())
        self._notice("truncated" if shorter and not out else "rotated",
                     f"{self.path} restarted at byte 0 (was at {self.offset})")
        await self._seek(0)
        self._inode = 0
        return out

    async def _drain_rotated(self) -> list[Line]:
        """If PATH.1 holds our bytes at our offset (a rename or copytruncate rotation), the
        lines written after our last read are there: read them to its end."""
        old = self.path + ".1"
        k = len(self._finger)
        if not k:
            return []
        out: list[Line] = []
        try:
            data = await self.transport.read_range(old, self.offset - k, k + self.chunk)
            if data[:k] != self._finger:
                return []
            while len(data) > k:
                out += self._take(data[k:])
                k = len(self._finger)
                data = await self.transport.read_range(old, self.offset - k, k + self.chunk)
        except CommandFailed:
            return out
        return out

