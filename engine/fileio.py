"""The engine's file I/O helpers, each written once: atomic files and directories, the JSON
reader, a file's sha256, and regular-file-only opens. Standard library only (no torch), so
engine/ckpt/target_config.py and the commands' fast paths can use it.

Writing
    atomic_file(path)        yields a temp name beside PATH (`.NAME.tmp-PID-HEX`); renamed over
                             PATH when the block succeeds, removed when it fails, so PATH is
                             always the old file or the complete new one.
    write_text / write_json  a whole text or JSON document through atomic_file.
    replace_dir(tmp, dst)    a finished temp directory becomes DST: an existing DST is moved aside,
                             the new one renamed in (signals held back between the two renames),
                             and only then the old one removed: DST is never missing or partial.
    atomic_dir(dst, tmp)     mkdir a temp dir beside DST, yield it, replace_dir on success and
                             remove it on any failure (engine/ckpt/output_dir.py adds owner files
                             and stale-temp cleanup on top for drafter outputs).
    termination_raises()     SIGTERM/SIGHUP unwind like Ctrl-C, so every `finally` cleans up.
Reading
    read_json(path)          the document, or an EngineError naming the file (and for bad JSON
                             the line and column).
    json_line(raw, where)    one JSONL line's document, or an EngineError starting with `where`
                             (bad UTF-8, bad JSON, NaN/Infinity, nesting too deep).
    nonfinite_field(doc)     the first field of a document holding NaN or Infinity (the config
                             readers refuse it by name).
    sha256_file(path)        streamed through a bounded window (engine/ckpt/hash_cache.py caches
    it). open_regular(path)       opens only regular files and never blocks on a FIFO.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import math
import mmap
import os
import shutil
import signal
import stat
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from engine.errors import EngineError

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
SHA_WINDOW = 16 << 20  # bytes of a file hashed per mmap window


# -- reading ---------------------------------------------------------------------------------------

def file_kind(mode: int) -> str:
    for test, what in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return what
    return "not a regular file"


def reason(e: OSError) -> str:
    """An OSError as the end of a one-line message ("too many levels of symbolic links")."""
    if e.errno == errno.ENOENT:
        return "does not exist"
    text = e.strerror or str(e)
    return text[:1].lower() + text[1:]


def open_regular(path: Path | str, buffering: int = -1) -> io.BufferedReader | io.FileIO:
    """Open `path` for reading only if it is a regular file. The open never blocks (O_NONBLOCK:
    opening a FIFO for reading would wait forever for a writer) and the check is on the opened
    file, so nothing can be swapped in between. OSError passes through for the caller to word."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise EngineError(f"{path}: not a regular file ({file_kind(mode)})")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    # outside the try: once fdopen's file object exists it owns fd, and a signal that unwinds us
    # now closes it through that object. Closing fd here as well turned Ctrl-C into EBADF (and,
    # with threads, could close a file someone else had just been given the number for).
    return os.fdopen(fd, "rb", buffering=buffering)  # type: ignore[return-value]


def read_regular_text(path: Path | str) -> str:
    """A small text file (config, index), through open_regular."""
    with open_regular(path) as f:
        return f.read().decode("utf-8")


def read_json(path: Path | str, *, missing: str = "does not exist", obj: bool = True) -> Any:
    """A JSON file's document. Every failure is one EngineError naming the file: `PATH: missing`
    (the wording `missing` gives), `cannot read (...)`, `not valid JSON (... line L column C ...)`
    or, with `obj` (the default), `not a JSON object`."""
    try:
        text = read_regular_text(path)
    except FileNotFoundError:
        raise EngineError(f"{path}: {missing}") from None
    except OSError as e:
        raise EngineError(f"{path}: cannot read ({reason(e)})") from None
    except UnicodeDecodeError as e:
        raise EngineError(f"{path}: not valid JSON ({e})") from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise EngineError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:
        raise EngineError(f"{path}: not valid JSON (nested too deeply)") from None
    if obj and not isinstance(data, dict):
        raise EngineError(f"{path}: not a JSON object")
    return data


def nonfinite_field(d: Any, where: str = "") -> str | None:
    """The first field (dotted path) of a JSON document holding NaN or +-Infinity, else None."""
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else ()
    for k, v in items:
        path = f"{where}[{k}]" if isinstance(k, int) else f"{where}.{k}" if where else str(k)
        if isinstance(v, float) and not math.isfinite(v):
            return path
        if isinstance(v, (dict, list)) and (bad := nonfinite_field(v, path)) is not None:
            return bad
    return None


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_line(raw: bytes, where: str) -> Any:
    """One JSONL line's document; bad bytes, bad JSON and nesting too deep for the parser are
    each one EngineError starting with `where` ("file:line"). Python's NaN/Infinity extension
    is refused too: a document carrying one would be copied on (regen writes a line's other
    fields back) into files no strict JSON reader takes."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise EngineError(f"{where}: not UTF-8 (byte {raw[e.start]:#04x} at column "
                          f"{e.start + 1})") from None
    try:
        return json.loads(text, parse_constant=_not_json)
    except json.JSONDecodeError as e:
        raise EngineError(f"{where}: invalid JSON ({e.msg})") from None
    except ValueError as e:   # valid syntax the parser refuses: an int over 4300 digits
        raise EngineError(f"{where}: invalid JSON ({e})") from None
    except RecursionError:
        raise EngineError(f"{where}: invalid JSON (nested too deeply)") from None


def sha256_file(path: Path | str, window: int = SHA_WINDOW) -> str:
    """sha256 of a file, hashing page-cache pages in place (mmap windows: no copy into Python,
    and resident memory stays at one window, whatever the file's size)."""
    h = hashlib.sha256()
    with open_regular(path, buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        step = max(mmap.ALLOCATIONGRANULARITY,
                   window // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY)
        for off in range(0, size, step):
            n = min(step, size - off)
            with mmap.mmap(f.fileno(), n, access=mmap.ACCESS_READ, offset=off) as m:
                h.update(m)
    return h.hexdigest()


# -- signals ---------------------------------------------------------------------------------------

class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: unwinds like Ctrl-C so every `finally` cleans up."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def termination_raises() -> Iterator[None]:
    """SIGTERM/SIGHUP raise Terminated (SIGINT raises KeyboardInterrupt as usual) in the main
    thread for the duration; after the first one all three are ignored, so a second signal cannot
    cut the cleanup short. Signals the process inherited as ignored (nohup) stay ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}

    def handler(signum: int, frame: FrameType | None) -> None:
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(signum)

    for s, h in previous.items():
        if h is not signal.SIG_IGN:
            signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGTERM/SIGHUP/SIGINT back while DST is swapped: a signal that arrives is recorded
    and acted on (with the handler that was in place) only after the block. A signal mask would
    not do: Python runs its handlers in the main thread whichever thread the kernel picked."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    for s, h in previous.items():
        if h is not signal.SIG_IGN:
            signal.signal(s, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        if arrived:
            h = previous[signal.Signals(arrived[0])]
            if callable(h):
                h(arrived[0], None)  # raises: Terminated, KeyboardInterrupt
            else:
                os.kill(os.getpid(), arrived[0])  # the default action, now that DST is whole


# -- writing ---------------------------------------------------------------------------------------

def temp_name(path: Path, kind: str = "tmp") -> Path:
    """`.NAME.KIND-PID-HEX` beside `path`: hidden, unique, and naming its writer."""
    return path.parent / f".{path.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@contextmanager
def atomic_file(path: Path | str, tmp: Path | str | None = None) -> Iterator[Path]:
    """Yield a temp name beside `path` (or `tmp`: a fixed name that a rerun overwrites instead
    of leaving a killed writer's copy behind) for the block to write; rename it over `path` only
    if the block succeeds (any failure, Ctrl-C included, removes it)."""
    path = Path(path)
    tmp = Path(tmp) if tmp is not None else temp_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_text(path: Path | str, text: str) -> None:
    """Replace `path` with `text` (UTF-8) atomically."""
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def json_text(data: Any, indent: int | None = 2,
              default: Callable[[Any], Any] | None = None) -> str:
    """The one JSON layout the engine writes: indented (by default) and ending in a newline.
    Strict JSON only: NaN and Infinity (which Python would write bare, and other parsers refuse)
    raise ValueError."""
    if indent is None:
        return json.dumps(data, separators=(",", ":"), default=default, allow_nan=False) + "\n"
    return json.dumps(data, indent=indent, default=default, allow_nan=False) + "\n"


def write_json(path: Path | str, data: Any, indent: int | None = 2,
               default: Callable[[Any], Any] | None = None) -> None:
    """Replace `path` with `data` as JSON atomically (strict JSON: json_text)."""
    try:
        text = json_text(data, indent, default)
    except ValueError as e:
        raise EngineError(f"{path}: not written ({e})") from None
    write_text(path, text)


def _remove(path: Path) -> None:
    """Delete a path's old copy: a real directory as a tree, anything else (file, symlink, FIFO)
    as a name; a symlink's target is never touched."""
    if stat.S_ISDIR(os.lstat(path).st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def replace_dir(tmp: Path, dst: Path, log: Callable[[str], None] | None = None) -> None:
    """The complete directory `tmp` becomes `dst`. An existing DST (directory, file or symlink)
    is moved aside first and removed only after the new one is in place; if the second rename
    fails the old DST is put back. No stop signal lands between the renames."""
    tmp, dst = Path(tmp), Path(dst)
    old = None
    with signals_deferred():
        if os.path.lexists(dst):
            old = temp_name(dst, "old")
            os.replace(dst, old)
            try:
                os.replace(tmp, dst)
            except BaseException:
                os.replace(old, dst)
                raise
        else:
            os.replace(tmp, dst)
        if old is not None:
            try:
                _remove(old)
            except OSError as e:
                if log:
                    log(f"{old}: the previous {dst.name}, moved aside, could not be removed "
                        f"({e.strerror or e})")


@contextmanager
def atomic_dir(dst: Path | str, tmp: Path | None = None,
               log: Callable[[str], None] | None = None) -> Iterator[Path]:
    """Yield a new temp dir beside `dst` (or `tmp`, which must not exist); it replaces `dst`
    (replace_dir) only if the block succeeds, and is removed on any failure, Ctrl-C included."""
    dst = Path(dst)
    tmp = Path(tmp) if tmp is not None else temp_name(dst)
    made = False
    try:  # mkdir inside: a stop signal right after it must still remove the temp dir
        tmp.mkdir()
        made = True
        yield tmp
        replace_dir(tmp, dst, log)
    except BaseException as e:
        if made or not isinstance(e, FileExistsError):  # never someone else's directory
            shutil.rmtree(tmp, ignore_errors=True)
        raise
