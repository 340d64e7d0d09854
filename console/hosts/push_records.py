"""Push records on the host: ROOT/manifests/<key>.json says what the last push of a tree sent
(files, kept, foreign, content hash, time); a `.pending` note beside it names the files an
unfinished push was sending. Reading one never trusts it: entries that are malformed or would
leave the tree are dropped with a warning (console/hosts/push.py uses these)."""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from console.errors import CommandFailed
from console.hostside.manifest import Manifest

if TYPE_CHECKING:
    from console.hosts.host import Host


@dataclass
class Record:
    """A push record as read back, entries that could leave the tree already dropped."""

    files: Manifest
    kept: Manifest
    foreign: set[str]
    hash: str | None
    time: float
    stale: bool = False          # an older format, or entries were dropped: write it anew

    @property
    def owned(self) -> set[str]:
        return (set(self.files) - self.foreign) | set(self.kept)


#: 2: `foreign` lists files push did not write; `kept` holds only files it did
RECORD_VERSION = 2


def record_path(root: str, remote: str) -> str:
    """ROOT/manifests/<name>-<key>.json: the record of the tree pushed to `remote`."""
    key = hashlib.sha1(remote.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    base = posixpath.basename(remote.rstrip("/")) or "root"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in base)
    return posixpath.join(root, "manifests", f"{safe}-{key}.json")


def pending_path(record: str) -> str:
    return record[:-len(".json")] + ".pending"


def safe_rel(rel: object) -> bool:
    """Whether a path from a record or a scan names a file inside its tree: relative, no `.`,
    `..` or empty parts, no NUL, and representable as bytes on the host."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\0" in rel:
        return False
    if any(part in ("", ".", "..") for part in rel.split("/")):
        return False
    try:
        rel.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


def _entries(raw: object, what: str, warn: Callable[[str], None]) -> Manifest:
    """A record's {rel: [size, mtime, sha256]}, entries that are malformed or would leave the
    tree dropped with a warning."""
    if not isinstance(raw, dict):
        if raw is not None:
            warn(f"{what} is not a table; ignored")
        return {}
    out: Manifest = {}
    for rel, v in raw.items():
        ok = (isinstance(v, list) and len(v) >= 3 and isinstance(v[0], int)
              and isinstance(v[1], (int, float)) and isinstance(v[2], str))
        if not safe_rel(rel):
            warn(f"{what}: ignoring {_show(rel)}: not a path inside the tree")
        elif not ok:
            warn(f"{what}: ignoring {_show(rel)}: malformed entry")
        else:
            out[rel] = [v[0], v[1], v[2]]
    return out


def _show(rel: object) -> str:
    """A path for a one-line message: odd bytes and controls as backslash escapes."""
    if isinstance(rel, str):
        return ascii(rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"))
    return repr(rel)


async def read_record(host: Host, path: str, warn: Callable[[str], None]) -> Record | None:
    """The record at path; None when there is none or it cannot be used (then nothing in the
    tree counts as written by push)."""
    st = await host.transport.stat(path)
    if st is None:
        return None
    try:
        rec = json.loads(await host.transport.read_range(path, 0, st.size))
        if not isinstance(rec, dict) or not isinstance(rec.get("files"), dict):
            raise ValueError("no files table")
    except (ValueError, CommandFailed) as e:
        warn(f"push record {host.name}:{path} is unreadable ({e}); the folder is scanned "
             f"and no file in it counts as pushed")
        return None
    what = f"push record {host.name}:{path}"
    files = _entries(rec.get("files"), what, warn)
    legacy = rec.get("v") is None
    # before version 2, `kept` also took in files found at the remote that push never wrote
    kept = {} if legacy else _entries(rec.get("kept"), what, warn)
    foreign = rec.get("foreign") or []
    if not isinstance(foreign, list):
        foreign = []
    h = rec.get("hash")
    try:
        t = float(rec.get("time", 0))
    except (TypeError, ValueError):
        t = 0.0
    dropped = len(files) != len(rec["files"]) or (
        not legacy and len(kept) != len(rec.get("kept") or {}))
    return Record(files, kept, {f for f in foreign if isinstance(f, str)},
                   h if isinstance(h, str) else None, t, stale=legacy or dropped)


async def read_pending(host: Host, path: str) -> list[str] | None:
    """The files an unfinished push was sending (None: no such push)."""
    st = await host.transport.stat(path)
    if st is None:
        return None
    try:
        data = json.loads(await host.transport.read_range(path, 0, st.size))
        send = data.get("send") if isinstance(data, dict) else None
        return [r for r in send if safe_rel(r)] if isinstance(send, list) else []
    except (ValueError, CommandFailed):
        return []
