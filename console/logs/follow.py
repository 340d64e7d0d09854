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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from itertools import accumulate, repeat
from operator import add
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, overload

from console.errors import CommandFailed, TransportError
from console.logs.vllm_log import strip_ansi
from console.transport.base import Transport

if TYPE_CHECKING:
    from console.hosts.host import Host

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


class LineBatch(Sequence[Line]):
    """The whole lines one read brought: a sequence of Line, made on demand.

    A busy log brings tens of thousands of lines per read; a consumer that looks at a few of
    them (the last screenful, the metrics lines via `containing`) should not pay for making
    every one. Iterating or indexing makes them all, once."""

    __slots__ = ("data", "base", "_lines", "_count")

    def __init__(self, data: bytes = b"", base: int = 0, lines: list[Line] | None = None) -> None:
        self.data = data            # complete lines, each ending with b"\n" (unused if lines)
        self.base = base            # byte offset of data[0] in the file
        self._lines = lines
        self._count: int | None = None

    def __len__(self) -> int:
        if self._lines is not None:
            return len(self._lines)
        if self._count is None:
            self._count = self.data.count(b"\n")
        return self._count

    @overload
    def __getitem__(self, i: int) -> Line: ...
    @overload
    def __getitem__(self, i: slice) -> list[Line]: ...

    def __getitem__(self, i: int | slice) -> Line | list[Line]:
        return self.lines()[i]

    def __iter__(self) -> Iterator[Line]:
        return iter(self.lines())

    def __repr__(self) -> str:
        return f"LineBatch({len(self)} lines at byte {self.base})"

    def lines(self) -> list[Line]:
        """Every line, made once."""
        if self._lines is None:
            self._lines = split_lines(self.data, self.base)
            self.data = b""
        return self._lines

    def columns(self) -> tuple[list[int], list[str]]:
        """(offsets, texts) of every line, the same as the Lines say, without making a Line
        per line: for ASCII (nearly every log) one decode and one split of the whole read."""
        data = self.data
        if self._lines is not None or not data.isascii():
            lines = self.lines()
            return [ln.offset for ln in lines], [ln.text for ln in lines]
        text = data.decode("ascii")
        texts = text.split("\n")
        texts.pop()  # data ends with a newline (or is empty)
        # each line starts one byte (its newline) after the previous one ends
        offsets = list(accumulate(map(add, map(len, texts), repeat(1)), initial=self.base))
        offsets.pop()
        if "\r" in text:
            texts = [t[:-1] if t[-1:] == "\r" else t for t in texts]
        return offsets, texts

    def containing(self, needles: Sequence[str]) -> list[Line]:
        """The lines containing any of needles (in file order), making only those."""
        if self._lines is not None:
            return [ln for ln in self._lines if any(n in ln.text for n in needles)]
        data, spans = self.data, set()
        for needle in needles:
            nb = needle.encode()
            i = data.find(nb)
            while i >= 0:
                start = data.rfind(b"\n", 0, i) + 1
                end = data.find(b"\n", i)
                spans.add((start, end))
                i = data.find(nb, end)
        out = []
        for start, end in sorted(spans):
            raw = data[start:end]
            out.append(Line(self.base + start, raw.rstrip(b"\r").decode("utf-8", "replace")))
        return out


def split_lines(data: bytes, base: int) -> list[Line]:
    """data (complete lines) as Lines; a line over MAX_LINE bytes comes in MAX_LINE pieces."""
    parts = data.split(b"\n")
    if parts and parts[-1] == b"":
        parts.pop()
    off = base
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
    return out


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
        self._ahead: tuple[int, asyncio.Task[bytes]] | None = None  # the next read, started early
        self.lines_read = 0
        self.bytes_read = 0

    @classmethod
    def on_host(cls, host: Host, path: str, **kw: Any) -> LogFollower:
        """A follower of `path` through the host's connection (the keywords of __init__)."""
        return cls(host.transport, path, **kw)

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

    async def batches(self) -> AsyncIterator[LineBatch]:
        """Batches of whole lines (sequences of Line), in file order, as they appear. Ends at
        the end of the file unless following."""
        try:
            async for batch in self._loop():
                yield batch
        finally:
            self._drop_ahead()

    async def _loop(self) -> AsyncIterator[LineBatch]:
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
            yield LineBatch(lines=[self._flush_partial()])

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
        self._drop_ahead()
        self.offset = self._partial_at = offset
        self._partial = b""
        lo = max(0, offset - FINGERPRINT)
        self._finger = (await self.transport.read_range(self.path, lo, offset - lo)
                        if offset else b"")

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

    async def _read_once(self) -> LineBatch | None:
        """One read: the lines it completed ([] if none yet), None at the end of the file."""
        k = len(self._finger)
        try:
            data = await self._read(self.offset - k, k + self.chunk)
        except CommandFailed:
            if not self.transport.connected:
                raise
            if await self.transport.stat(self.path) is None:
                return None                   # gone (mid-rotation) or not created yet: wait
            # there now: created (or rotated in) between the read and the stat; read again,
            # and a second failure is the file's own (unreadable): said, not waited on
            data = await self.transport.read_range(self.path, self.offset - k, k + self.chunk)
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
        batch = self._take(new)
        if len(new) >= self.chunk:  # behind the writer: fetch the next chunk while this is used
            k = len(self._finger)
            start = self.offset - k
            self._ahead = (start, asyncio.ensure_future(
                self.transport.read_range(self.path, start, k + self.chunk)))
        return batch

    async def _read(self, start: int, length: int) -> bytes:
        """read_range, taking the read started ahead when it is the one wanted."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            if ahead[0] == start:
                return await ahead[1]
            self._ahead = ahead
            self._drop_ahead()
        return await self.transport.read_range(self.path, start, length)

    def _drop_ahead(self) -> None:
        if self._ahead is not None:
            task = self._ahead[1]
            task.cancel()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._ahead = None

    def _take(self, new: bytes) -> LineBatch:
        self.offset += len(new)
        self.bytes_read += len(new)
        self._finger = new[-FINGERPRINT:] if len(new) >= FINGERPRINT else \
            (self._finger + new)[-FINGERPRINT:]
        buf = self._partial + new if self._partial else new
        cut = buf.rfind(b"\n") + 1
        whole, self._partial = buf[:cut], buf[cut:]
        base = self._partial_at
        self._partial_at = base + cut
        batch = LineBatch(whole, base)
        if cut > MAX_LINE // 2 and _may_hold_long_line(whole):
            batch = LineBatch(lines=split_lines(whole, base))
        if len(self._partial) > MAX_LINE:      # a newline-free flood: hand it out in pieces
            lines = batch.lines()
            while len(self._partial) > MAX_LINE:
                piece, self._partial = self._partial[:MAX_LINE], self._partial[MAX_LINE:]
                lines.append(Line(self._partial_at, piece.decode("utf-8", "replace")))
                self._partial_at += len(piece)
            batch = LineBatch(lines=lines)
        return batch

    def _flush_partial(self) -> Line:
        line = Line(self._partial_at, self._partial.decode("utf-8", "replace").rstrip("\r"))
        self._partial_at += len(self._partial)
        self._partial = b""
        return line

    async def _replaced(self, shorter: bool) -> LineBatch:
        """The file is not the one we were reading: drain the old one's rest, restart at 0."""
        out = await self._drain_rotated()
        if self._partial:
            out.append(self._flush_partial())
        self._notice("truncated" if shorter and not out else "rotated",
                     f"{self.path} restarted at byte 0 (was at {self.offset})")
        await self._seek(0)
        self._inode = 0
        return LineBatch(lines=out)

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
                out += self._take(data[k:]).lines()
                k = len(self._finger)
                data = await self.transport.read_range(old, self.offset - k, k + self.chunk)
        except CommandFailed:
            return out
        return out


def _may_hold_long_line(data: bytes) -> bool:
    """Whether data may hold a line over MAX_LINE bytes: any such line covers a whole aligned
    window of MAX_LINE // 2 bytes with no newline (a few C-speed finds per chunk)."""
    step = MAX_LINE // 2
    return any(data.find(b"\n", i, i + step) < 0 for i in range(0, len(data) - step + 1, step))
