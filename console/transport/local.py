"""LocalTransport: this machine, through asyncio subprocesses (no shell for argv).

Every process starts in a new session, so a timeout, a cancelled task or a closed stream ends
the whole process group (the command and the children it started), as the SSH transport does:
SIGTERM first so the command can clean up, SIGKILL after TERM_GRACE seconds.
File operations are the same atomic ones as over SSH: a temp name beside the target, then
os.replace. Remote paths accept `~`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import stat as stat_mod
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

from console.errors import CommandFailed, TransportError
from console.transport.base import (
    CommandResult,
    FileStat,
    TcpStream,
    Transport,
    gather_all_or_none,
)
from console.transport.tempfiles import temp_name as owned_temp_name

#: longest stdout line stream() accepts (a JSON event with a big payload must still fit)
LINE_LIMIT = 16 * 1024 * 1024
#: how much of a streamed command's stderr is kept for the CommandFailed message
STDERR_TAIL = 64 * 1024
CHUNK = 1024 * 1024
UPLOAD_CONCURRENCY = 4
#: seconds a cancelled or timed-out command has between SIGTERM and SIGKILL to clean up
TERM_GRACE = 5.0


def expand(path: str) -> str:
    """A host path as the OS wants it: `~` expanded."""
    return os.path.expanduser(path)


def temp_name(target: str) -> str:
    """A temp name beside target (same filesystem, so the rename is atomic) that says which
    console process wrote it: console/transport/tempfiles.py."""
    return owned_temp_name(target)


def _signal_group(pgid: int, sig: int) -> bool:
    """Send sig to the process group; False when the group is gone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


async def _terminate_group(proc: asyncio.subprocess.Process, grace: float | None = None) -> None:
    """End the process group proc leads (it was started with a new session): SIGTERM first, so
    the command can clean up (an engine removes its temp files), SIGKILL for whatever is still
    there after `grace` seconds. Returns once proc is reaped."""
    grace = TERM_GRACE if grace is None else grace
    # the group id is the leader's pid: it cannot be reused while the leader is unreaped or
    # any member of the group is left, and only then is it signalled
    pgid = proc.pid
    if _signal_group(pgid, signal.SIGTERM):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), grace)
        # children of the command may outlive it for a moment (they got the TERM too)
        while loop.time() < deadline and _signal_group(pgid, 0):
            await asyncio.sleep(0.05)
        if _signal_group(pgid, 0):
            _signal_group(pgid, signal.SIGKILL)
    await proc.wait()


def _decode(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")


class LocalTransport(Transport):
    """The machine the console runs on."""

    def __init__(self, name: str = "local") -> None:
        self.name = name

    async def connect(self) -> None:
        return None

    async def close(self) -> None:
        return None

    @property
    def connected(self) -> bool:
        return True

    @property
    def connects(self) -> int:
        return 1  # always connected, never dropped

    # -- commands ---------------------------------------------------------------------------

    async def _spawn(self, argv: Sequence[str], cwd: str | None, env: Mapping[str, str] | None,
                     stdin: int | None, limit: int = 2 ** 16
                     ) -> asyncio.subprocess.Process | CommandResult:
        """Start argv in a new session; a start failure becomes the result a shell would give."""
        full_env = {**os.environ, **env} if env else None
        try:
            return await asyncio.create_subprocess_exec(
                *argv, cwd=expand(cwd) if cwd else None, env=full_env, stdin=stdin,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True, limit=limit)
        except (FileNotFoundError, NotADirectoryError) as e:
            # what sh would say: 127 for a missing program, 2 for a missing cwd
            missing_cwd = cwd is not None and not os.path.isdir(expand(cwd))
            return CommandResult(2 if missing_cwd else 127, "",
                                 f"{e.filename or argv[0]}: {e.strerror}\n")
        except PermissionError as e:
            return CommandResult(126, "", f"{e.filename or argv[0]}: {e.strerror}\n")
        except OSError as e:
            return CommandResult(126, "", f"{argv[0]}: {e}\n")

    async def run(self, argv: Sequence[str], *, cwd: str | None = None,
                  env: Mapping[str, str] | None = None, input: str | bytes | None = None,
                  timeout: float | None = None, check: bool = False) -> CommandResult:
        argv = list(argv)
        proc = await self._spawn(argv, cwd, env,
                                 asyncio.subprocess.PIPE if input is not None else
                                 asyncio.subprocess.DEVNULL)
        if isinstance(proc, CommandResult):
            result = proc
        else:
            data = input.encode() if isinstance(input, str) else input
            try:
                out, err = await asyncio.wait_for(proc.communicate(data), timeout)
            except asyncio.TimeoutError as e:
                await asyncio.shield(_terminate_group(proc))
                raise CommandFailed(self.name, argv, None, f"timed out after {timeout} s") from e
            except BaseException:
                # cancelled: take the process group with us (TERM, then KILL)
                with contextlib.suppress(BaseException):
                    await asyncio.shield(_terminate_group(proc))
                raise
            result = CommandResult(proc.returncode if proc.returncode is not None else -1,
                                   _decode(out), _decode(err))
        if check and not result.ok:
            raise CommandFailed(self.name, argv, result.returncode, result.stderr)
        return result

    async def run_script(self, script: str, *, input: str | bytes | None = None,
                         timeout: float | None = None, check: bool = False) -> CommandResult:
        try:
            return await self.run(["sh", "-c", script], input=input, timeout=timeout, check=check)
        except CommandFailed as e:
            # name the script, not `sh -c ...`, in the message
            raise CommandFailed(self.name, script, e.returncode, e.stderr) from e

    async def stream(self, argv: Sequence[str], *, cwd: str | None = None,
                     env: Mapping[str, str] | None = None) -> AsyncIterator[str]:
        argv = list(argv)
        proc = await self._spawn(argv, cwd, env, asyncio.subprocess.DEVNULL, limit=LINE_LIMIT)
        if isinstance(proc, CommandResult):
            raise CommandFailed(self.name, argv, proc.returncode, proc.stderr)
        assert proc.stdout is not None and proc.stderr is not None
        err_tail = bytearray()

        async def drain_stderr() -> None:
            # stderr must be read concurrently or a chatty process blocks on a full pipe
            assert proc.stderr is not None
            while chunk := await proc.stderr.read(65536):
                err_tail.extend(chunk)
                del err_tail[:-STDERR_TAIL]

        err_task = asyncio.ensure_future(drain_stderr())
        finished = False
        try:
            while True:
                try:
                    line = await proc.stdout.readline()
                except ValueError as e:  # a line over LINE_LIMIT
                    raise CommandFailed(self.name, argv, None,
                                        f"output line longer than {LINE_LIMIT} bytes") from e
                if not line:
                    break
                yield _decode(line[:-1] if line.endswith(b"\n") else line)
            await err_task
            rc = await proc.wait()
            finished = True
            if rc != 0:
                raise CommandFailed(self.name, argv, rc, _decode(bytes(err_tail)))
        finally:
            if not finished:
                with contextlib.suppress(BaseException):
                    await asyncio.shield(_terminate_group(proc))
                err_task.cancel()

    # -- files ------------------------------------------------------------------------------

    def _fail(self, op: str, e: OSError) -> CommandFailed:
        return CommandFailed(self.name, op, None, f"{e.filename or ''}: {e.strerror or e}")

    def _upload_failed(self, src: str, dst: str, e: OSError) -> CommandFailed:
        if e.errno == errno.ENOSPC:  # said as the SSH transport says it
            return CommandFailed(self.name, f"upload {src} -> {dst}", None,
                                 f"no space left on {self.name}:{os.path.dirname(dst)}")
        return self._fail(f"upload {src} -> {dst}", e)

    async def upload(self, files: Sequence[tuple[str, str]], *, mode: int | None = None) -> int:
        sem = asyncio.Semaphore(UPLOAD_CONCURRENCY)

        async def one(src: str, dst: str) -> int:
            async with sem:
                return await self._upload_one(src, dst, mode)

        return sum(await gather_all_or_none(one(s, d) for s, d in files))

    async def _upload_one(self, src: str, dst: str, mode: int | None) -> int:
        src, dst = expand(src), expand(dst)
        try:
            st = os.stat(src)
            Path(dst).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise self._upload_failed(src, dst, e) from e
        tmp = temp_name(dst)
        try:
            sent = await _copy_in_thread(src, tmp, st.st_mode & 0o7777 if mode is None else mode)
            os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.replace(tmp, dst)
            return sent
        except OSError as e:
            raise self._upload_failed(src, dst, e) from e
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    async def write_bytes(self, path: str, data: bytes, *, mode: int | None = None) -> None:
        path = expand(path)
        tmp = temp_name(path)
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            with open(fd, "wb") as f:
                if mode is not None:
                    os.fchmod(f.fileno(), mode)
                f.write(data)
            os.replace(tmp, path)
        except OSError as e:
            raise self._fail(f"write {path}", e) from e
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    async def read_range(self, path: str, offset: int, length: int) -> bytes:
        try:
            with open(expand(path), "rb") as f:
                st = os.fstat(f.fileno())
                if stat_mod.S_ISREG(st.st_mode):
                    # a follower asks for a whole chunk (MiBs) where a few KB are new: read()
                    # would allocate the whole request first
                    length = max(0, min(length, st.st_size - offset))
                f.seek(offset)
                return f.read(length)
        except OSError as e:
            raise self._fail(f"read {path}", e) from e

    async def stat(self, path: str) -> FileStat | None:
        try:
            st = os.stat(expand(path))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise self._fail(f"stat {path}", e) from e
        return FileStat(size=st.st_size, mtime=st.st_mtime, is_dir=stat_mod.S_ISDIR(st.st_mode),
                        mode=st.st_mode, inode=st.st_ino)

    async def remove(self, paths: Sequence[str]) -> None:
        for p in paths:
            try:
                os.unlink(expand(p))
            except FileNotFoundError:
                pass
            except OSError as e:
                raise self._fail(f"remove {p}", e) from e

    # -- TCP --------------------------------------------------------------------------------

    async def open_tcp(self, host: str, port: int) -> TcpStream:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError as e:
            why = os.strerror(e.errno) if e.errno else str(e)  # asyncio's text names the address
            raise TransportError(self.name, f"cannot connect to {host}:{port}: {why}") from e
        return TcpStream(self.name, f"{host}:{port}", reader, writer, (OSError, EOFError))


async def _copy_in_thread(src: str, dst: str, mode: int) -> int:
    """Copy src to a new file dst in a worker thread, in chunks, stopping at the next chunk when
    the awaiting task is cancelled (and only returning once the thread let go of the file, so
    the caller's cleanup cannot race it)."""
    stop = threading.Event()

    def work() -> int:
        n = 0
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(src, "rb") as fin, open(fd, "wb") as fout:
            os.fchmod(fout.fileno(), mode)
            while chunk := fin.read(CHUNK):
                if stop.is_set():
                    raise asyncio.CancelledError
                fout.write(chunk)
                n += len(chunk)
        return n

    fut = asyncio.get_running_loop().run_in_executor(None, work)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        stop.set()
        with contextlib.suppress(BaseException):
            await fut
        raise
