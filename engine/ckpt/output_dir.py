"""Output directories written atomically, and the only things an output ever deletes.

atomic_output_dir(dst, force) yields a temp dir `.NAME.tmp-PID-HEX` beside DST holding an owner
file (our PID, its start time and the boot id); the block writes into it and it is renamed to DST
at the end. Any failure, Ctrl-C, SIGTERM or SIGHUP (with `termination_raises()` around the work)
removes it, so DST is complete or absent. What may be deleted, and nothing else:
  - our own temp dir, on failure;
  - DST itself with `force`, only when it is a drafter directory (a real directory holding
    config.json, weights and nothing but drafter files: what save_drafter and convert write, or
    a downloaded drafter) or an empty directory; moved aside and removed only after the new DST
    is in place. Anything else (a file, a symlink, a folder holding a user's notes.txt, a
    trainer checkpoint with its optimizer state) is refused, naming what is in the way, and
    nothing is deleted (`replace_refusal`);
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
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.errors import EngineError
from engine.fileio import (  # noqa: F401 -- Terminated, termination_raises: this module's API
    Terminated,
    atomic_dir,
    read_json,
    termination_raises,
)
from engine.fileio import signals_deferred as _signals_deferred  # noqa: F401 -- tests use it

OWNER_FILE = ".eagle3-owner"
# Everything an output dir may hold while it is being written (save_drafter and convert).
OUR_FILES = frozenset({OWNER_FILE, "model.safetensors", "config.json", "provenance.json"})
# What `--force` may delete: the files of a drafter directory, ours or a downloaded one's.
DRAFTER_FILE = re.compile(r"config\.json|generation_config\.json|provenance\.json|"
                          r"[^/]+\.safetensors|model\.safetensors\.index\.json|"
                          r"pytorch_model[^/]*\.bin|pytorch_model\.bin\.index\.json|"
                          + re.escape(OWNER_FILE))
WEIGHT_FILE = re.compile(r"[^/]+\.safetensors|pytorch_model[^/]*\.bin")


class DestinationError(EngineError):
    """DST may not be written: it exists, is not ours to replace, or is tied to an input. The
    console reads this type from the `error` event to keep the user in the convert dialog."""


def replace_refusal(dst: Path) -> str | None:
    """Why `--force` may not replace `dst` (None: it is a drafter directory or an empty one)."""
    if os.path.islink(dst):
        return "is a symlink"
    if not os.path.isdir(dst):
        return "is not a directory"
    try:
        entries = sorted(os.scandir(dst), key=lambda e: e.name)
    except OSError as e:
        return f"cannot be listed ({e.strerror})"
    names = [e.name for e in entries]
    for ent in entries:
        if ent.is_dir(follow_symlinks=False):
            return f"holds the folder {ent.name}/"
        if not ent.is_file(follow_symlinks=False) or not DRAFTER_FILE.fullmatch(ent.name):
            return f"holds {ent.name}, which is not a drafter file"
    if names and ("config.json" not in names or not any(WEIGHT_FILE.fullmatch(n)
                                                         for n in names)):
        return "is not a drafter directory (no config.json with weights)"
    return None


def check_replaceable(dst: Path, force: bool) -> None:
    """Raise DestinationError unless `dst` is absent, or `force` and replace_refusal allows."""
    if not os.path.lexists(dst):
        return
    if not force:
        raise DestinationError(f"{dst}: already exists (use --force to replace it)")
    why = replace_refusal(dst)
    if why is not None:
        raise DestinationError(
            f"{dst}: not replaced, it {why}; --force replaces only a drafter directory "
            "(config.json, weights, nothing else): choose another DST or move it away yourself")


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
                        data = read_json(ent.path)
                    except EngineError:
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


@contextmanager
def atomic_output_dir(dst: Path, force: bool = False,
                      log: Callable[[str], None] | None = None) -> Iterator[Path]:
    """Yield a temp dir beside `dst` holding an owner file; it replaces `dst` (engine/fileio.py's
    atomic_dir) only if the block succeeds."""
    dst = Path(dst)
    check_replaceable(dst, force)
    dst.parent.mkdir(parents=True, exist_ok=True)
    for p in remove_stale_temps(dst):
        if log:
            log(f"removed {p}: temp output of a run that was killed")
    pid = os.getpid()
    with atomic_dir(dst, dst.parent / f".{dst.name}.tmp-{pid}-{uuid.uuid4().hex[:8]}",
                    log) as tmp:
        owner = tmp / OWNER_FILE
        owner.write_text(json.dumps({"pid": pid, "start": process_start(pid)}) + "\n",
                         encoding="utf-8")
        yield tmp
        owner.unlink()
