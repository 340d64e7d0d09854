"""The transport interface: how the console runs things on a host (local or over SSH).

Every method raises only console.errors.TransportError subclasses (never a library's own
exception). Commands are given as argv lists and each implementation quotes them itself, so no
caller ever builds a shell string from untrusted parts; `run_script` is for the few fixed shell
snippets we write ourselves, with every variable part passed through `quote`.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import shlex
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from console.errors import TransportError


def quote(arg: str) -> str:
    """POSIX shell quoting of one word (what every remote command is built with)."""
    return shlex.quote(arg)


def shell_path(path: str) -> str:
    """A path as one shell word, keeping a leading `~` live (`~/'a b'`) so it means home."""
    if path == "~":
        return "~"
    if path.startswith("~/"):
        return "~/" + quote(path[2:]) if path[2:] else "~/"
    return quote(path)


def command_line(argv: Sequence[str], cwd: str | None = None,
                 env: Mapping[str, str] | None = None) -> str:
    """A POSIX shell command line for argv, run in cwd (which may start with `~`) with extra
    env, every part quoted."""
    parts: list[str] = []
    if cwd:
        parts.append(f"cd {shell_path(cwd)} &&")
    if env:
        parts.append("env " + " ".join(quote(f"{k}={v}") for k, v in env.items()))
    parts.append(" ".join(quote(a) for a in argv))
    return " ".join(parts)


async def gather_all_or_none(coros: Iterable[Awaitable[int]]) -> list[int]:
    """Run coroutines concurrently; the first failure (or our cancellation) cancels the rest and
    waits for them, so each can clean up (e.g. remove its temp file) before the error surfaces."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(frozen=True)
class CommandResult:
    """What a finished command returned."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


@dataclass(frozen=True)
class FileStat:
    """The parts of stat(2) the console uses."""

    size: int
    mtime: float
    is_dir: bool
    mode: int
    inode: int = 0


class TcpStream:
    """A TCP connection opened from the host's side (`Transport.open_tcp`): bytes in and out,
    library errors turned into TransportError like everything else a transport does."""

    def __init__(self, host: str, where: str, reader: Any, writer: Any,
                 errors: tuple[type[BaseException], ...]) -> None:
        self.host, self.where = host, where
        self._reader, self._writer, self._errors = reader, writer, errors

    def _fail(self, what: str, e: BaseException) -> TransportError:
        return TransportError(self.host, f"{self.where}: {what}: {e or type(e).__name__}")

    async def write(self, data: bytes) -> None:
        try:
            self._writer.write(data)
            await self._writer.drain()
        except self._errors as e:
            raise self._fail("send failed", e) from e

    async def read(self, n: int = 1 << 16) -> bytes:
        """Up to n bytes; b"" once the other side has closed."""
        try:
            return bytes(await self._reader.read(n))
        except self._errors as e:
            raise self._fail("receive failed", e) from e

    async def close(self) -> None:
        """Close; safe to call twice, never raises."""
        self._writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._writer.wait_closed(), 2.0)

    async def __aenter__(self) -> TcpStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Transport(abc.ABC):
    """One host. Implementations keep one long-lived connection and reconnect on demand."""

    #: the host name as configured ("local", "gpu1", ...)
    name: str

    @abc.abstractmethod
    async def connect(self) -> None:
        """Open the connection (no-op for local). Raises Unreachable, AuthFailed, HostKey*."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the connection; safe to call twice."""

    @property
    @abc.abstractmethod
    def connected(self) -> bool:
        """True while a live connection is held."""

    @property
    @abc.abstractmethod
    def connects(self) -> int:
        """How many times the connection was (re)established: 0 before the first connect, one
        more for each reconnect after a drop; constant where there is no link to drop. Work
        spanning several calls compares it before and after: a change means operations were
        retried on a new link and may have left something on the old one (an upload's temp)."""

    @abc.abstractmethod
    async def run(self, argv: Sequence[str], *, cwd: str | None = None,
                  env: Mapping[str, str] | None = None, input: str | bytes | None = None,
                  timeout: float | None = None, check: bool = False) -> CommandResult:
        """Run argv to completion. check=True raises CommandFailed on a non-zero exit."""

    @abc.abstractmethod
    async def run_script(self, script: str, *, input: str | bytes | None = None,
                         timeout: float | None = None, check: bool = False) -> CommandResult:
        """Run a POSIX sh script we wrote (variable parts already quoted with `quote`)."""

    @abc.abstractmethod
    def stream(self, argv: Sequence[str], *, cwd: str | None = None,
               env: Mapping[str, str] | None = None) -> AsyncIterator[str]:
        """Start argv and yield its stdout lines (without the newline) as they come.

        Closing the iterator or cancelling the consuming task kills the process. When the
        process exits non-zero, CommandFailed is raised after the last line."""

    @abc.abstractmethod
    async def upload(self, files: Sequence[tuple[str, str]], *, mode: int | None = None) -> int:
        """Copy local files to remote paths (parents created). Each file is written to a temp
        name beside its target and renamed into place, so an interrupted upload never leaves a
        partial file at the final name. Keeps the local mtime. Returns bytes sent."""

    @abc.abstractmethod
    async def write_bytes(self, path: str, data: bytes, *, mode: int | None = None) -> None:
        """Write data to a remote file atomically (temp name, then rename)."""

    @abc.abstractmethod
    async def read_range(self, path: str, offset: int, length: int) -> bytes:
        """Up to `length` bytes of the file starting at `offset` (short or empty at EOF)."""

    @abc.abstractmethod
    async def stat(self, path: str) -> FileStat | None:
        """stat() of path, or None when it does not exist."""

    @abc.abstractmethod
    async def remove(self, paths: Sequence[str]) -> None:
        """Delete files (missing ones ignored)."""

    @abc.abstractmethod
    async def open_tcp(self, host: str, port: int) -> TcpStream:
        """A TCP connection to host:port made *from the host* (its loopback is `127.0.0.1`):
        over SSH a direct-tcpip channel of the existing connection, so no port is opened
        anywhere and nothing travels outside SSH. TransportError when it is refused."""

    async def __aenter__(self) -> Transport:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
