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
    nothing is deleted (`replace_refusal`). `prepare --overwrite` replaces a prepared-data
    directory under the same rule, with its own `DirKind` (engine/data/prepare.py);
  - a stale temp dir of an earlier run beside DST: it must have our exact name shape, be a real
    directory holding only regular files with the names we write, and its owner must be gone
    (no process with that PID, or one whose start time differs from the owner file: a reused
    PID). Without an owner file (killed in the instant after mkdir, or an older engine) only a
    PID that no longer exists counts as gone.
And before anything: DST may not be, contain or lie inside an input (`check_not_tied`: by
resolved path and by device and inode), so replacing it can never take an input with it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
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


@dataclass(frozen=True)
class DirKind:
    """A kind of output directory that `flag` may replace: one holding nothing but `files`
    (regular files, no folder) and, unless empty, passing `complete` (its file names)."""

    name: str  # "drafter directory"
    files: re.Pattern[str]
    complete: Callable[[list[str]], bool]
    contents: str  # what it holds, for the refusal: "config.json, weights, nothing else"
    flag: str = "--force"


DRAFTER_DIR = DirKind(
    "drafter directory", DRAFTER_FILE,
    lambda names: "config.json" in names and any(WEIGHT_FILE.fullmatch(n) for n in names),
    "config.json, weights, nothing else")


def replace_refusal(dst: Path, kind: DirKind = DRAFTER_DIR) -> str | None:
    """Why `kind.flag` may not replace `dst` (None: it is such a directory or an empty one)."""
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
        if not ent.is_file(follow_symlinks=False) or not kind.files.fullmatch(ent.name):
            return f"holds {ent.name}, which does not belong in a {kind.name}"
    if names and not kind.complete(names):
        return f"is not a {kind.name} ({kind.contents})"
    return None


def check_replaceable(dst: Path, force: bool, kind: DirKind = DRAFTER_DIR) -> None:
    """Raise DestinationError unless `dst` is absent, or `force` and replace_refusal allows."""
    if not os.path.lexists(dst):
        return
    if not force:
        raise DestinationError(f"{dst}: already exists (use {kind.flag} to replace it)")
    why = replace_refusal(dst, kind)
    if why is not None:
        raise DestinationError(
            f"{dst}: not replaced, it {why}; {kind.flag} replaces only a {kind.name} "
            f"({kind.contents}): choose another destination or move it away yourself")


def _places(p: Path) -> list[Path]:
    """Where a path really is: its name in its resolved parent (what a rename or delete of `p`
    acts on) and, when it is a symlink that resolves, what it points at."""
    out = [Path(os.path.realpath(p.parent)) / p.name]
    if os.path.islink(p):
        try:
            out.append(Path(os.path.realpath(p, strict=True)))
        except (OSError, RuntimeError):
            pass  # dangling or a loop: only the link itself can be replaced
    return out


def _identity(p: Path) -> tuple[tuple[int, int] | None, set[tuple[int, int]]]:
    """(device, inode) of `p` (None if absent) and of each of its existing ancestors: the same
    directory seen through a bind mount or a second path still compares equal."""
    def ident(q: Path) -> tuple[int, int] | None:
        try:
            st = os.stat(q)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    ancestors = {i for q in p.parents if (i := ident(q)) is not None}
    return ident(p), ancestors


def check_not_tied(dst: Path, inputs: Sequence[tuple[Path, str, bool]], flag: str = "--force",
                   choose: str = "DST") -> Path:
    """Refuse a DST that is or contains an input, or lies inside one whose flag (the tuple's
    third item) says so; inputs are (path, "the source SRC", no_inside). Compared by resolved
    path and by (device, inode), so no symlink, `..` or bind mount hides the relation; returns
    DST with a usable name (`.` and `..` resolved)."""
    if dst.name in ("", ".", ".."):
        dst = Path(os.path.realpath(dst))
        if not dst.name:
            raise DestinationError(f"{dst}: not a usable output directory")
    resolved = [(Path(os.path.realpath(p)), what, no_inside) for p, what, no_inside in inputs]
    for place in _places(dst):
        pid, pup = _identity(place)
        for real, what, no_inside in resolved:
            rid, rup = _identity(real)
            if place == real or (pid is not None and pid == rid):
                raise DestinationError(f"{dst}: is {what} (choose another {choose})")
            if place in real.parents or (pid is not None and pid in rup):
                raise DestinationError(f"{dst}: contains {what} ({flag} would delete it; "
                                       f"choose another {choose})")
            if no_inside and (real in place.parents or (rid is not None and rid in pup)):
                raise DestinationError(f"{dst}: is inside {what} (choose a {choose} outside it)")
    return dst


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
