"""Output directories written atomically, and the only things an output ever deletes.

atomic_output_dir(dst, force) yields a temp dir `.NAME.tmp-PID-HEX` beside DST holding an owner
file (our PID, its start time and the boot id); the block writes into it and it is renamed to DST
at the end. Any failure, Ctrl-C, SIGTERM or SIGHUP (with `termination_raises()` around the work)
removes it, so DST is complete or absent. What may be deleted, and nothing else:
  - our own temp dir, on failure;
  - DST itself with `force` (a directory tree, or a single file or symlink: never what a symlink
    points at), moved aside and removed only after the new DST is in place;
  - a stale temp dir of an earlier run beside DST: it must have our exact name shape, be a real
    directory holding only regular files with the names we write, and its owner must be gone
    (no process with that PID, or one whose start time differs from the owner file: a reused
    PID). Without an owner file (killed in the instant after mkdir, or an older engine) only a
    PID that no longer exists counts as gone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from engine.errors import EngineError

OWNER_FILE = ".eagle3-owner"
# Everything an output dir may hold while it is being written (save_drafter and convert).
OUR_FILES = frozenset({OWNER_FILE, "model.safetensors", "config.json", "provenance.json"})
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


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
def _signals_deferred() -> Iterator[None]:
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


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_start(pid: int) -> str | None:
    """`BOOT_ID:START_TICKS` of a live process (None when it cannot be read): with the PID, it
    names one process for the whole uptime of the machine, where a PID alone gets reused."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces, ')'
        return f"{_boot_id()}:{fields[19]}"  # field 22 of proc(5): starttime
    except (OSError, ValueError, IndexError):
        return None


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    except (OverflowError, ValueError, OSError):
        return False
    return True


def _temp_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"\.{re.escape(name)}\.tmp-(\d{{1,10}})-[0-9a-f]{{8}}")


def _owner_record(path: Path, pid: int) -> tuple[bool, str | None]:
    """(whether the dir is in our shape: only regular files with our names, and an owner file,
    if readable, naming the same PID; the owner's recorded start, None if unknown)."""
    recorded: str | None = None
    try:
        with os.scandir(path) as it:
            for ent in it:
                if ent.name not in OUR_FILES or not ent.is_file(follow_symlinks=False):
                    return False, None
                if ent.name == OWNER_FILE:
                    try:
                        data = json.loads(Path(ent.path).read_text(encoding="utf-8"))
                    except (OSError, ValueError):
                        continue
                    if not isinstance(data, dict):
                        continue
                    if data.get("pid") != pid:
                        return False, None  # someone else's file under our name
                    if isinstance(data.get("start"), str):
                        recorded = data["start"]
    except OSError:
        return False, None
    return True, recorded


def _owner_alive(pid: int, recorded: str | None) -> bool:
    if not _pid_exists(pid):
        return False
    if recorded is None:
        return True  # cannot tell a reused PID from the owner: keep it
    now = process_start(pid)
    return now is None or now == recorded


def remove_stale_temps(dst: Path) -> list[Path]:
    """Remove temp dirs beside `dst` left by killed runs (see the module docstring for the
    rules); returns the ones removed."""
    pattern = _temp_pattern(dst.name)
    removed: list[Path] = []
    try:
        entries = list(os.scandir(dst.parent))
    except OSError:
        return removed
    for ent in entries:
        m = pattern.fullmatch(ent.name)
        if not m or not ent.is_dir(follow_symlinks=False):
            continue
        pid = int(m[1])
        if pid == os.getpid():
            continue
        path = Path(ent.path)
        ours, recorded = _owner_record(path, pid)
        if not ours or _owner_alive(pid, recorded):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            removed.append(path)
    return removed


def _remove(path: Path) -> None:
    """Delete DST's old copy: a real directory as a tree, anything else (file, symlink, FIFO)
    as a name; a symlink's target is never touched."""
    if stat.S_ISDIR(os.lstat(path).st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


@contextmanager
def atomic_output_dir(dst: Path, force: bool = False,
                      log: Callable[[str], None] | None = None) -> Iterator[Path]:
    """Yield a temp dir beside `dst`; rename it to `dst` only if the block succeeds."""
    dst = Path(dst)
    if os.path.lexists(dst) and not force:
        raise EngineError(f"{dst}: already exists (use --force to replace it)")
    dst.parent.mkdir(parents=True, exist_ok=True)
    for p in remove_stale_temps(dst):
        if log:
            log(f"removed {p}: temp output of a run that was killed")
    pid = os.getpid()
    tmp = dst.parent / f".{dst.name}.tmp-{pid}-{uuid.uuid4().hex[:8]}"
    try:  # mkdir inside: a stop signal right after it must still remove the temp dir
        tmp.mkdir()
        owner = tmp / OWNER_FILE
        owner.write_text(json.dumps({"pid": pid, "start": process_start(pid)}) + "\n",
                         encoding="utf-8")
        yield tmp
        owner.unlink()
        old = None
        with _signals_deferred():  # no signal may land between the two renames
            if os.path.lexists(dst):  # --force: move the old one aside, swap, then delete it
                old = dst.parent / f".{dst.name}.old-{uuid.uuid4().hex[:8]}"
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
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
