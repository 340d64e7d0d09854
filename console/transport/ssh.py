"""SSHTransport: one long-lived asyncssh connection to a host, commands over exec channels and
files over SFTP on the same connection.

- `ssh` is an ~/.ssh/config alias (HostName, User, Port, IdentityFile through asyncssh's config
  support; `ssh_config` overrides which file) or `user@host[:port]`. ProxyJump hops are dialled
  by console/transport/proxy_jump.py, each verified against the same known_hosts files as a
  host, errors naming the hop. Keys and ssh-agent are asyncssh's defaults; `identity` names one
  key file instead.
- Host keys are strict (console/transport/known_hosts.py): an unknown host or a changed key refuses
  the connection with HostKeyUnknown / HostKeyChanged naming the presented key's fingerprint
  (console/transport/host_key_errors.py).
- Keepalive notices a dead link; the next operation after a drop reconnects with backoff.
  Work in flight when the link drops raises Unreachable (a stream's caller resumes by offset).
- Every command runs as `printf MARK $$ >&2; <command>`: sshd starts each session in its own
  process group, so that pid is the group to end when a run times out, its task is cancelled
  or a stream is closed -- the command and every child it started go with it: SIGTERM first,
  so it can clean up, then SIGKILL after TERM_GRACE seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import stat as stat_mod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

import asyncssh

import console.transport.known_hosts as kh
from console.errors import CommandFailed, NoSFTP, TransportError, Unreachable
from console.transport.base import (
    CommandResult,
    FileStat,
    TcpStream,
    Transport,
    command_line,
    gather_all_or_none,
)
from console.transport.local import STDERR_TAIL, temp_name
from console.transport.proxy_jump import CONNECT_TIMEOUT, Client, Dialer

T = TypeVar("T")

PGID_MARK = b"__eagle3_pgid__ "
#: reconnect after a drop: first try at once, then wait 0.2 s doubling up to 5 s
BACKOFF_FIRST, BACKOFF_MAX, RECONNECT_TRIES = 0.2, 5.0, 6
KILL_TIMEOUT = 5.0
#: seconds a cancelled or timed-out command has between SIGTERM and SIGKILL to clean up
TERM_GRACE = 5.0
#: files up to this size go in one write; larger ones through asyncssh's pipelined put()
SMALL_FILE = 1 << 20
#: uploads in flight at once on the one SFTP session (hides round trips; measured 16-32 best)
SFTP_CONCURRENCY = 16

# what a dropped link looks like to the code using it
_LINK_ERRORS = (asyncssh.DisconnectError, asyncssh.ChannelOpenError, asyncssh.SFTPConnectionLost,
                asyncssh.SFTPNoConnection,
                ConnectionError, BrokenPipeError, EOFError)


def sftp_path(path: str) -> str:
    """SFTP resolves relative paths against the login directory: `~/x` is just `x`."""
    if path == "~":
        return "."
    if path.startswith("~/"):
        return path[2:] or "."
    return path


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


class _Remote:
    """A started remote command: its stderr is read in the background, where the first line
    (our marker) gives the process group to kill."""

    def __init__(self, transport: SSHTransport, process: asyncssh.SSHClientProcess,
                 client: Client, stderr_limit: int | None) -> None:
        self.t, self.process, self.client = transport, process, client
        self.pgid: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self.stderr = bytearray()
        self._limit = stderr_limit
        self._err_task = asyncio.ensure_future(self._read_stderr())

    async def _read_stderr(self) -> None:
        try:
            while line := await self.process.stderr.readline():
                if not self.pgid.done() and line.startswith(PGID_MARK):
                    with contextlib.suppress(ValueError):
                        self.pgid.set_result(int(line[len(PGID_MARK):].strip()))
                        continue
                self.stderr.extend(line)
                if self._limit is not None:
                    del self.stderr[:-self._limit]
        except _LINK_ERRORS:
            pass
        finally:
            if not self.pgid.done():
                self.pgid.set_result(None)

    def feed(self, data: str | bytes | None) -> None:
        """Send stdin and close it; a command that exits without reading it is not an error."""
        with contextlib.suppress(*_LINK_ERRORS):
            if data:
                self.process.stdin.write(data.encode() if isinstance(data, str) else data)
            self.process.stdin.write_eof()

    def stderr_text(self) -> str:
        return _decode(bytes(self.stderr))

    async def finish(self, label: str | list[str]) -> int:
        """Wait for exit and all stderr; the exit status (negative signal number if killed)."""
        await self.process.wait_closed()
        await self._err_task
        rc = self.process.returncode
        if rc is None:
            if self.client.lost:
                raise Unreachable(self.t.name, f"connection lost while running {_label(label)}")
            rc = 255  # channel closed without a status, as ssh(1) reports it
        return rc

    async def kill(self) -> None:
        """End the remote process group (best effort) and close the channel: SIGTERM first so
        the command can clean up (an engine removes its temp files), SIGKILL for whatever is
        left after TERM_GRACE seconds (one remote script, one round trip)."""
        try:
            # the marker comes before the command starts, right after the login shell's rc files
            pgid = await asyncio.wait_for(asyncio.shield(self.pgid), KILL_TIMEOUT)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            pgid = None
        conn = self.t._conn
        if pgid and conn is not None and not self.client.lost and self.t._client is self.client:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.run(terminate_script(pgid), check=False),
                                       TERM_GRACE + KILL_TIMEOUT)
        self.process.close()
        self._err_task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self.process.wait_closed(), 2.0)


def terminate_script(pgid: int, grace: float | None = None) -> str:
    """sh: TERM the process group, wait up to grace seconds for it to be gone, then KILL it.
    The group is ours: the session's own shell reported its pid, sshd made it the group leader,
    and the command has not finished (its channel is still open)."""
    ticks = max(1, int((TERM_GRACE if grace is None else grace) * 10))
    g = int(pgid)
    return (f"kill -s TERM -- -{g} 2>/dev/null || exit 0; i=0; "
            f"while [ $i -lt {ticks} ]; do kill -0 -- -{g} 2>/dev/null || exit 0; "
            # a POSIX-only sleep takes no fractions: then count whole seconds
            "sleep 0.1 2>/dev/null || { sleep 1; i=$((i+9)); }; i=$((i+1)); done; "
            f"kill -s KILL -- -{g} 2>/dev/null; true")


def _label(label: str | list[str]) -> str:
    text = label if isinstance(label, str) else " ".join(label)
    return f"`{text[:80]}`"


class SSHTransport(Transport):
    """A host reached over SSH."""

    def __init__(self, name: str, ssh: str, *, known_hosts: str | None = None,
                 ssh_config: str | None = None, identity: str | None = None,
                 connect_timeout: float = CONNECT_TIMEOUT) -> None:
        self.name = name
        self.ssh = ssh
        self.known_hosts = known_hosts
        self.ssh_config = ssh_config
        self.identity = identity
        self.connect_timeout = connect_timeout
        self._conn: asyncssh.SSHClientConnection | None = None
        self._jumps: list[asyncssh.SSHClientConnection] = []  # ProxyJump hops, outermost first
        self._client: Client | None = None
        self._sftp: asyncssh.SFTPClient | None = None
        self._lock = asyncio.Lock()
        self._sftp_lock = asyncio.Lock()
        self._was_connected = False  # a drop after this means: reconnect with backoff
        self._connects = 0

    # -- connection -------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._client is not None and not self._client.lost

    @property
    def connects(self) -> int:
        return self._connects

    async def connect(self) -> None:
        await self._ensure()

    async def close(self) -> None:
        conn, self._conn, self._client, self._sftp = self._conn, None, None, None
        jumps, self._jumps = self._jumps, []
        self._was_connected = False
        for c in ([conn] if conn is not None else []) + jumps[::-1]:
            c.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.wait_closed(), 5.0)

    async def _ensure(self) -> asyncssh.SSHClientConnection:
        """The live connection, opening it (or reopening it after a drop) when needed."""
        if self.connected:
            assert self._conn is not None
            return self._conn
        async with self._lock:
            if not self.connected:
                self._discard()
                if self._was_connected:
                    await self._reconnect()
                else:
                    await self._open()
            assert self._conn is not None
            return self._conn

    def _discard(self) -> None:
        for c in ([self._conn] if self._conn is not None else []) + self._jumps[::-1]:
            c.abort()
        self._conn, self._client, self._sftp, self._jumps = None, None, None, []

    async def _reconnect(self) -> None:
        delay = BACKOFF_FIRST
        for attempt in range(RECONNECT_TRIES):
            try:
                await self._open()
                return
            except Unreachable:
                if attempt == RECONNECT_TRIES - 1:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX)

    def _dialer(self) -> Dialer:
        return Dialer(self.name, self.ssh, self.known_hosts, self.ssh_config, self.identity,
                      self.connect_timeout)

    async def _open(self) -> None:
        conn, client, jumps = await self._dialer().host()
        self._conn, self._client, self._sftp, self._jumps = conn, client, None, jumps
        self._was_connected = True
        self._connects += 1

    async def open_jumps(self) -> tuple[kh.Target, kh.Resolved,
                                        asyncssh.SSHClientConnection | None]:
        """Dial only this host's ProxyJump hops, exactly as connect() does (same known_hosts,
        errors naming the hop); they stay open until close(). For `trust`, which must reach
        the host the way connections do: (target, resolved, the hop to tunnel through)."""
        target, resolved, via, self._jumps = await self._dialer().hops_only()
        return target, resolved, via

    # -- commands ---------------------------------------------------------------------------

    async def _start(self, command: str, stderr_limit: int | None) -> _Remote:
        """Open an exec channel for command; a link found dead at this point (nothing ran yet)
        is reopened once, transparently."""
        # same line as the command, so a script's line numbers in error messages stay right
        wrapped = f"printf '{PGID_MARK.decode()}%s\\n' \"$$\" >&2; {command}"
        for attempt in range(2):
            conn = await self._ensure()
            client = self._client
            assert client is not None
            try:
                process = await conn.create_process(wrapped, encoding=None)
            except _LINK_ERRORS as e:
                if client.lost and attempt == 0:
                    continue
                raise Unreachable(self.name, f"cannot start a command: {e}") from e
            return _Remote(self, process, client, stderr_limit)
        raise AssertionError("unreachable")

    async def _exec(self, command: str, label: str | list[str], input: str | bytes | None,
                    timeout: float | None) -> CommandResult:
        rp = await self._start(command, None)

        async def complete() -> tuple[bytes, int]:
            rp.feed(input)
            out = await rp.process.stdout.read()
            return out, await rp.finish(label)

        try:
            out, rc = await asyncio.wait_for(complete(), timeout)
        except asyncio.TimeoutError as e:
            await asyncio.shield(rp.kill())
            raise CommandFailed(self.name, label, None, f"timed out after {timeout} s") from e
        except asyncio.CancelledError:
            await asyncio.shield(rp.kill())
            raise
        except _LINK_ERRORS as e:
            raise Unreachable(self.name, f"connection lost while running {_label(label)}") from e
        return CommandResult(rc, _decode(out), rp.stderr_text())

    async def run(self, argv: Sequence[str], *, cwd: str | None = None,
                  env: Mapping[str, str] | None = None, input: str | bytes | None = None,
                  timeout: float | None = None, check: bool = False) -> CommandResult:
        argv = list(argv)
        result = await self._exec(command_line(argv, cwd, env), argv, input, timeout)
        if check and not result.ok:
            raise CommandFailed(self.name, argv, result.returncode, result.stderr)
        return result

    async def run_script(self, script: str, *, input: str | bytes | None = None,
                         timeout: float | None = None, check: bool = False) -> CommandResult:
        result = await self._exec(script, script, input, timeout)
        if check and not result.ok:
            raise CommandFailed(self.name, script, result.returncode, result.stderr)
        return result

    async def stream(self, argv: Sequence[str], *, cwd: str | None = None,
                     env: Mapping[str, str] | None = None) -> AsyncIterator[str]:
        argv = list(argv)
        rp = await self._start(command_line(argv, cwd, env), STDERR_TAIL)
        finished = False
        try:
            rp.feed(None)
            while True:
                try:
                    line = await rp.process.stdout.readline()
                except _LINK_ERRORS as e:
                    raise Unreachable(self.name, f"connection lost while streaming "
                                                 f"{_label(argv)}") from e
                if not line:
                    break
                yield _decode(line[:-1] if line.endswith(b"\n") else line)
            rc = await rp.finish(argv)
            finished = True
            if rc != 0:
                raise CommandFailed(self.name, argv, rc, rp.stderr_text())
        finally:
            if not finished:
                await asyncio.shield(rp.kill())

    # -- files (SFTP on the same connection) ------------------------------------------------

    async def _get_sftp(self, conn: asyncssh.SSHClientConnection) -> asyncssh.SFTPClient:
        async with self._sftp_lock:
            if self._sftp is None or self._conn is not conn:
                # paths are bytes on the wire: a name that is not UTF-8 round-trips through
                # Python's surrogate escapes (as os.fsencode does) instead of raising
                self._sftp = await conn.start_sftp_client(path_errors="surrogateescape")
            return self._sftp

    async def _sftp_call(self, op: str, fn: Callable[[asyncssh.SFTPClient], Awaitable[T]]) -> T:
        """Run fn against the SFTP session. Every file operation here is idempotent, so a link
        found dropped is reopened (with backoff) and fn retried once."""
        for attempt in range(2):
            conn = await self._ensure()
            client = self._client
            assert client is not None
            try:
                return await fn(await self._get_sftp(conn))
            except asyncssh.ChannelOpenError as e:
                # the subsystem request refused on a live connection: not a dropped link
                if e.code == asyncssh.OPEN_REQUEST_SESSION_FAILED and not client.lost:
                    raise NoSFTP(self.name, op) from e
                if client.lost and attempt == 0:
                    continue
                raise Unreachable(self.name, f"connection lost during {op}") from e
            except _LINK_ERRORS as e:
                if client.lost and attempt == 0:
                    continue
                raise Unreachable(self.name, f"connection lost during {op}") from e
            except asyncssh.SFTPError as e:
                raise CommandFailed(self.name, op, None, e.reason) from e
        raise AssertionError("unreachable")

    async def _rename(self, sftp: asyncssh.SFTPClient, src: str, dst: str) -> None:
        try:
            await sftp.posix_rename(src, dst)  # atomic replace (OpenSSH extension)
        except asyncssh.SFTPOpUnsupported:
            with contextlib.suppress(asyncssh.SFTPNoSuchFile):
                await sftp.remove(dst)
            await sftp.rename(src, dst)

    async def _makedirs(self, sftp: asyncssh.SFTPClient, parent: str, made: set[str]) -> None:
        if parent and parent not in made:
            await sftp.makedirs(parent, exist_ok=True)
            made.add(parent)

    async def _atomic(self, sftp: asyncssh.SFTPClient, path: str,
                      write: Callable[[asyncssh.SFTPClient, str], Awaitable[None]],
                      made: set[str]) -> None:
        """write(tmp) beside path, then rename over it; the temp never outlives a failure."""
        await self._makedirs(sftp, posixpath.dirname(path), made)
        tmp = temp_name(path)
        done = False
        try:
            await write(sftp, tmp)
            await self._rename(sftp, tmp, path)
            done = True
        finally:
            if not done:
                with contextlib.suppress(BaseException):
                    await asyncio.shield(sftp.remove(tmp))

    async def upload(self, files: Sequence[tuple[str, str]], *, mode: int | None = None) -> int:
        made: set[str] = set()
        sem = asyncio.Semaphore(SFTP_CONCURRENCY)

        async def one(src: str, dst: str) -> int:
            src = os.path.expanduser(src)
            try:
                st = os.stat(src)
            except OSError as e:
                raise CommandFailed(self.name, f"upload {src}", None, e.strerror or str(e)) from e
            attrs = asyncssh.SFTPAttrs(
                permissions=st.st_mode & 0o7777 if mode is None else mode,
                atime=int(st.st_atime), mtime=int(st.st_mtime))  # SFTP v3: whole seconds

            async def write(sftp: asyncssh.SFTPClient, tmp: str) -> None:
                if st.st_size > SMALL_FILE:
                    await sftp.put(src, tmp, sparse=False)  # pipelined block writes
                    await sftp.setstat(tmp, attrs)
                    return
                # small files: one write and the times set on the open handle, two round
                # trips fewer than put() (which also stats the target first)
                with open(src, "rb") as fin:
                    data = fin.read()
                async with sftp.open(tmp, "wb", asyncssh.SFTPAttrs(
                        permissions=attrs.permissions)) as f:
                    await f.write(data)
                    await f.setstat(attrs)

            async def op(sftp: asyncssh.SFTPClient) -> None:
                await self._atomic(sftp, sftp_path(dst), write, made)

            async with sem:
                try:
                    await self._sftp_call(f"upload {src} -> {dst}", op)
                except CommandFailed as e:
                    # SFTP v3 reports a full disk as a bare "Failure": ask the filesystem
                    parent = posixpath.dirname(dst) or "."
                    free = await self._free_bytes(parent)
                    if free is not None and free < st.st_size:
                        raise CommandFailed(self.name, f"upload {src} -> {dst}", None,
                                            f"no space left on {self.name}:{parent} "
                                            f"({free} bytes free, file is {st.st_size})") from e
                    raise
            return st.st_size

        return sum(await gather_all_or_none(one(s, d) for s, d in files))

    async def _free_bytes(self, path: str) -> int | None:
        """Bytes an unprivileged writer may still use on path's filesystem (None: unknown)."""
        async def op(sftp: asyncssh.SFTPClient) -> int:
            v = await sftp.statvfs(sftp_path(path))
            return int(v.bavail) * int(v.frsize or v.bsize)

        try:
            return await self._sftp_call(f"statvfs {path}", op)
        except (TransportError, asyncssh.Error):
            return None

    async def write_bytes(self, path: str, data: bytes, *, mode: int | None = None) -> None:
        async def op(sftp: asyncssh.SFTPClient) -> None:
            async def write(sftp: asyncssh.SFTPClient, tmp: str) -> None:
                attrs = asyncssh.SFTPAttrs(permissions=mode) if mode is not None else \
                    asyncssh.SFTPAttrs()
                async with sftp.open(tmp, "wb", attrs) as f:
                    await f.write(data)
                if mode is not None:
                    await sftp.chmod(tmp, mode)  # exact, whatever the server's umask
            await self._atomic(sftp, sftp_path(path), write, set())

        await self._sftp_call(f"write {path}", op)

    async def read_range(self, path: str, offset: int, length: int) -> bytes:
        async def op(sftp: asyncssh.SFTPClient) -> bytes:
            async with sftp.open(sftp_path(path), "rb") as f:
                data = await f.read(length, offset)
                return data if isinstance(data, bytes) else data.encode()

        return await self._sftp_call(f"read {path}", op)

    async def stat(self, path: str) -> FileStat | None:
        async def op(sftp: asyncssh.SFTPClient) -> FileStat | None:
            try:
                a = await sftp.stat(sftp_path(path))
            except asyncssh.SFTPNoSuchFile:
                return None
            perm = a.permissions or 0
            return FileStat(size=a.size or 0, mtime=float(a.mtime or 0),
                            is_dir=stat_mod.S_ISDIR(perm), mode=perm, inode=0)

        return await self._sftp_call(f"stat {path}", op)

    async def remove(self, paths: Sequence[str]) -> None:
        async def op(sftp: asyncssh.SFTPClient) -> None:
            async def one(p: str) -> None:
                with contextlib.suppress(asyncssh.SFTPNoSuchFile):
                    await sftp.remove(sftp_path(p))
            await asyncio.gather(*(one(p) for p in paths))

        await self._sftp_call(f"remove {', '.join(paths)[:100]}", op)

    # -- TCP through the connection (direct-tcpip) ------------------------------------------

    async def open_tcp(self, host: str, port: int) -> TcpStream:
        where = f"{host}:{port}"
        for attempt in range(2):
            conn = await self._ensure()
            client = self._client
            assert client is not None
            try:
                reader, writer = await conn.open_connection(host, port)
            except asyncssh.ChannelOpenError as e:
                if client.lost:
                    if attempt == 0:
                        continue  # found dead: reopened once, as for a command
                    raise Unreachable(self.name, f"connection lost opening {where}") from e
                hint = (" (the host's sshd forbids forwarding: AllowTcpForwarding)"
                        if e.code == asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED else "")
                raise TransportError(self.name, f"cannot connect to {where} from the host: "
                                                f"{e.reason or 'refused'}{hint}") from e
            except _LINK_ERRORS as e:
                if client.lost and attempt == 0:
                    continue
                raise Unreachable(self.name, f"connection lost opening {where}") from e
            return TcpStream(self.name, where, reader, writer, (*_LINK_ERRORS, asyncssh.Error))
        raise AssertionError("unreachable")
