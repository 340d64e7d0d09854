"""Incremental push: send a host the files that changed, and nothing else.

A push covers trees (local folder -> remote folder). The engine package (this checkout's
`engine/`, found via `engine.__file__`) and the host helpers (`console/hostside/`) are always
among them, to ROOT/code/engine and ROOT/code/eagle3_hostside; sync sets from the config go to
their own remote folders (never `/`, ROOT or above it, nor inside ROOT/code, ROOT/runs or
ROOT/manifests: console/settings/config.py refuses those, and sync_tree checks again once `~` is
resolved). For each tree:

1. the local side is walked with gitignore-style excludes into a manifest
   {path: [size, mtime, sha256]}; the host's copy of the manifest is the record of the last
   push, ROOT/manifests/<key>.json, read over SFTP (no command run, so a slow login shell on
   the host costs nothing). A local file whose size and mtime equal its recorded entry keeps
   the recorded hash (rsync's quick check, with git's guard for edits in the same clock tick);
   any other file is hashed;
2. files whose size or sha256 differ from the record (or are not in it) are uploaded over the
   one connection, each to a temp name then renamed (Transport.upload), keeping mtime and mode.
   Before the first upload of a tree a note, ROOT/manifests/<key>.pending, names the files
   being sent; it is removed when the push has finished;
3. with `delete`, files that vanished locally are removed remotely, but only files a push
   wrote: the record's `files` (less its `foreign` list: files found already at the remote,
   identical, which we never wrote) and `kept` (written earlier, gone locally, not yet
   deleted). Anything else at the remote, excluded files, and files changed on the host since
   we wrote them (seen by a scan) are left alone. Record entries that are not plain relative
   paths inside the tree (`..`, absolute) are ignored with a warning;
4. the record is rewritten (files, content hash, local git commit), so a run can say exactly
   which code it ran.

Without a record (a first push, a lost record), after an unfinished push (the .pending note),
or with `verify`, the remote folder is scanned instead by console/hostside/manifest.py run with
the host's Python (one command for all trees, skipped when the folder does not exist yet): that
also repairs files edited on the host behind the console's back. `verify` re-reads every remote
file (a same-size corruption is found too) and clears the bytecode caches of the code trees. A
scan also lists the console's upload temps (console/transport/tempfiles.py): those whose
console process is gone are removed. A second push with no local change reads one small file
per tree (and checks for a .pending note) and sends nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import posixpath
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import console.hostside
import console.hostside.manifest as manifest_mod
import engine
from console.errors import CommandFailed, ConfigError, ConsoleError
from console.hostside.manifest import Manifest, manifest_hash, sha256_file, walk
from console.settings.config import Config, SyncSet, sync_remote_problem
from console.transport import tempfiles

if TYPE_CHECKING:
    from console.hosts.host import Host

ENGINE_DIR = Path(engine.__file__).resolve().parent
HOSTSIDE_DIR = Path(console.hostside.__file__).resolve().parent
#: remote package name of console/hostside (importable with PYTHONPATH=ROOT/code)
HOSTSIDE_PACKAGE = "eagle3_hostside"
#: files per upload call: progress is reported between calls
UPLOAD_BATCH_FILES = 512
UPLOAD_BATCH_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Tree:
    """One local folder mirrored to one remote folder."""

    name: str                    # "engine", "hostside" or the sync set's name
    local: Path
    remote: str                  # absolute path on the host
    exclude: tuple[str, ...] = ()
    code: bool = False           # the console's own code (ROOT/code/...): its caches are ours


@dataclass
class TreeResult:
    """What pushing one tree did."""

    name: str
    remote: str
    files: int                   # files in the tree after the push
    sent: int                    # files uploaded
    bytes: int                   # bytes uploaded
    deleted: int                 # remote files removed (--delete)
    extra: int                   # remote files not in the local tree, kept (no --delete)
    hash: str                    # manifest_hash of the tree as pushed
    git: str | None              # local commit (+"-dirty"), when the folder is a git checkout
    foreign: int = 0             # remote-only files push did not write: never deleted (scans)
    cleaned: int = 0             # stale temp files (and, verify, bytecode caches) removed


@dataclass
class PushReport:
    """A whole push: every tree, and one hash naming the code a run will use."""

    host: str
    trees: list[TreeResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)   # one line each, for the user

    @property
    def files_sent(self) -> int:
        return sum(t.sent for t in self.trees)

    @property
    def bytes_sent(self) -> int:
        return sum(t.bytes for t in self.trees)

    @property
    def manifest(self) -> str:
        """Hash over every tree's hash: what run.json records as `manifest`."""
        h = hashlib.sha256()
        for t in sorted(self.trees, key=lambda t: t.name):
            h.update(f"{t.name}\0{t.hash}\n".encode())
        return h.hexdigest()

    def record(self) -> dict[str, Any]:
        """The push as run.json stores it."""
        return {"manifest": self.manifest, "trees": {t.name: t.hash for t in self.trees},
                "git": {t.name: t.git for t in self.trees if t.git}}


# -- which trees ----------------------------------------------------------------------------------

async def engine_trees(host: Host) -> list[Tree]:
    """The engine package and the host helpers: pushed on every push."""
    code = await host.code_dir()
    return [Tree("engine", ENGINE_DIR, posixpath.join(code, "engine"), code=True),
            Tree("hostside", HOSTSIDE_DIR, posixpath.join(code, HOSTSIDE_PACKAGE), code=True)]


async def sync_tree(host: Host, sync: SyncSet) -> Tree:
    local = Path(sync.local).expanduser()
    if not local.is_dir():
        raise ConfigError(f"[sync.{sync.name}] local: {local} is not a folder")
    remote, root = await host.resolve(sync.remote), await host.root()
    why = sync_remote_problem(remote, root)   # again, now that `~` is resolved
    if why is not None:
        raise ConfigError(f"[sync.{sync.name}] remote = {sync.remote!r} ({host.name}:{remote}) "
                          f"is refused: {why}")
    return Tree(sync.name, local, remote, tuple(sync.exclude))


async def host_trees(host: Host, config: Config, syncs: Sequence[str] | None) -> list[Tree]:
    """Engine trees plus the named sync sets (default: every set configured for this host)."""
    if syncs is None:
        names = [s.name for s in config.syncs.values() if s.host == host.name]
    else:
        names = list(syncs)
    trees = await engine_trees(host)
    for n in names:
        if n not in config.syncs:
            known = ", ".join(config.syncs) or "none defined"
            raise ConfigError(f"unknown sync set {n!r} (configured: {known})")
        trees.append(await sync_tree(host, config.syncs[n]))
    return trees


# -- the push -------------------------------------------------------------------------------------

ProgressFn = Callable[[int, int, int], None]   # (files done, files to send, bytes sent)

#: a local file modified this close (seconds) to the last push is re-hashed even when its size
#: and mtime match the record (git's "racy clean" rule: same-tick edits keep the mtime)
RACY_WINDOW = 2.0


@dataclass
class _Remote:
    """What the host has for one tree, and which of it push wrote."""

    files: Manifest              # from the push record, or from a scan of the remote folder
    record_hash: str | None      # hash stored in the record (None: no record)
    record_time: float = 0.0     # when the recorded local scan happened
    from_record: bool = False    # entries carry the *local* mtimes of the last push
    owned: set[str] = field(default_factory=set)   # files an earlier push wrote
    temps: list[str] = field(default_factory=list)  # console temp files found by a scan
    pyc: list[str] = field(default_factory=list)    # bytecode caches found by a scan
    pending: bool = False        # an earlier push of this tree did not finish
    foreign: set[str] = field(default_factory=set)  # the record's `foreign` list
    rewrite: bool = False        # the record must be written even if nothing changed


@dataclass
class _Record:
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


#: pushes in flight in this process, per (host, remote folder): a temp file of this very process
#: is an orphan (of a dropped connection) only when no other push of that tree is running
_ACTIVE: dict[tuple[str, str], int] = {}


async def push(host: Host, trees: Sequence[Tree], *, delete: bool = False, verify: bool = False,
               on_progress: ProgressFn | None = None) -> PushReport:
    """Bring every tree on host up to date with the local side (see the module docstring).

    The host's copy of the manifest is the record of the last push (one SFTP read, no command
    run). Where there is no record, or the last push did not finish, the remote folder is
    scanned (or known empty); `verify` always scans, re-reading every file, to repair files
    changed on the host behind the console's back."""
    await host.connect()
    root = await host.root()
    keys = [(host.name, t.remote) for t in trees]
    for k in keys:
        _ACTIVE[k] = _ACTIVE.get(k, 0) + 1
    try:
        return await _push(host, root, trees, delete, verify, on_progress)
    finally:
        for k in keys:
            _ACTIVE[k] -= 1
            if not _ACTIVE[k]:
                del _ACTIVE[k]


async def _push(host: Host, root: str, trees: Sequence[Tree], delete: bool, verify: bool,
                on_progress: ProgressFn | None) -> PushReport:
    report = PushReport(host.name)
    records = [_record_path(root, t) for t in trees]
    scan_time = time.time()
    local_task = asyncio.ensure_future(asyncio.to_thread(_walk_local, trees))
    try:
        remote = await _remote_state(host, trees, records, verify, report.warnings)
    finally:
        walked = await local_task
    cleaned = await _clean_leftovers(host, trees, remote, verify)
    # which files need their hash before we can tell whether they changed
    known: list[Manifest] = []
    to_hash: list[tuple[int, str]] = []
    later: list[tuple[int, str]] = []            # sent whatever their hash: hashed meanwhile
    for i, (files, rem) in enumerate(zip(walked, remote, strict=False)):
        man: Manifest = {}
        for rel, (size, mtime) in files.items():
            r = rem.files.get(rel)
            if (r and rem.from_record and r[0] == size and r[1] == mtime
                    and mtime < rem.record_time - RACY_WINDOW):
                man[rel] = [size, mtime, r[2]]    # quick check: unchanged since the last push
            elif r and r[0] == size:
                to_hash.append((i, rel))
            else:
                later.append((i, rel))
        known.append(man)
    await asyncio.to_thread(_hash_into, trees, walked, known, to_hash)
    send = [(i, rel) for i, rel in to_hash if remote[i].files[rel][2] != known[i][rel][2]]
    send += later
    # an interrupted push leaves this note: the next push scans (and cleans up its temps)
    sending = sorted({i for i, _rel in send})
    await asyncio.gather(*(host.transport.write_bytes(
        _pending_path(records[i]), json.dumps({"owner": tempfiles.owner(), "time": scan_time,
                                               "send": [r for j, r in send if j == i]}).encode())
        for i in sending))
    uploads = [(str(trees[i].local / rel), posixpath.join(trees[i].remote, rel)) for i, rel in send]
    sizes = {str(trees[i].local / rel): (trees[i].name, walked[i][rel][0]) for i, rel in send}
    hashing = asyncio.ensure_future(asyncio.to_thread(_hash_into, trees, walked, known, later))
    connects = getattr(host.transport, "connects", 0)
    try:
        per_tree = await _upload(host, uploads, sizes, on_progress)
    finally:
        await hashing
    # the link dropped and uploads were retried on a new one: temps of the old link may be
    # left, so the .pending note stays and the next push scans for them
    relinked = getattr(host.transport, "connects", 0) != connects
    sent_rels = [{rel for j, rel in send if j == i} for i in range(len(trees))]
    # remote files not in the local tree: only those an earlier push wrote may be deleted
    gone = [[rel for rel in rem.files if rel not in walked[i] and rel in rem.owned]
            for i, rem in enumerate(remote)]
    foreign_left = [sum(1 for rel in rem.files if rel not in walked[i] and rel not in rem.owned)
                    for i, rem in enumerate(remote)]
    if delete:
        removals = [posixpath.join(trees[i].remote, rel) for i, g in enumerate(gone) for rel in g]
        if removals:
            await host.transport.remove(removals)
    gits = await asyncio.gather(*(asyncio.to_thread(git_commit, t.local) for t in trees))
    writes = []
    rows = zip(trees, known, remote, records, gits, strict=True)
    for i, (tree, man, rem, rec, git) in enumerate(rows):
        h = manifest_hash(man)
        removed = len(gone[i]) if delete else 0
        report.trees.append(TreeResult(tree.name, tree.remote, len(man), len(sent_rels[i]),
                                       per_tree.get(tree.name, 0), removed,
                                       0 if delete else len(gone[i]), h, git,
                                       foreign_left[i], cleaned[i]))
        # files pushed before, gone locally but kept remotely: remembered for a later --delete
        kept = {} if delete else {rel: rem.files[rel] for rel in gone[i]}
        # local files found already at the remote (same content) that no push of ours wrote
        foreign = sorted(rel for rel in man if rel not in rem.owned and rel not in sent_rels[i])
        unchanged = (rem.from_record and rem.record_hash == h and not removed
                     and rem.files == {**man, **kept} and set(foreign) == rem.foreign
                     and not rem.pending and not rem.rewrite)
        if not unchanged:
            body = {"v": RECORD_VERSION, "name": tree.name, "local": str(tree.local),
                    "remote": tree.remote, "hash": h, "git": git, "time": scan_time,
                    "files": man, "kept": kept, "foreign": foreign}
            writes.append(host.transport.write_bytes(rec, json.dumps(body).encode()))
    await asyncio.gather(*writes)
    done = [_pending_path(records[i]) for i, rem in enumerate(remote)
            if (rem.pending or i in sending) and not (relinked and i in sending)]
    if done:
        await host.transport.remove(done)
    return report


#: 2: `foreign` lists files push did not write; `kept` holds only files it did
RECORD_VERSION = 2


def _record_path(root: str, tree: Tree) -> str:
    key = hashlib.sha1(tree.remote.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    base = posixpath.basename(tree.remote.rstrip("/")) or "root"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in base)
    return posixpath.join(root, "manifests", f"{safe}-{key}.json")


def _pending_path(record: str) -> str:
    return record[:-len(".json")] + ".pending"


def _walk_local(trees: Sequence[Tree]) -> list[dict[str, tuple[int, float]]]:
    out = []
    for t in trees:
        if not t.local.is_dir():
            raise ConfigError(f"{t.name}: local folder {t.local} does not exist")
        out.append(walk(str(t.local), list(t.exclude)))
    return out


def _hash_into(trees: Sequence[Tree], walked: list[dict[str, tuple[int, float]]],
               known: list[Manifest], which: Sequence[tuple[int, str]]) -> None:
    for i, rel in which:
        size, mtime = walked[i][rel]
        known[i][rel] = [size, mtime, sha256_file(str(trees[i].local / rel))]


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


async def _read_record(host: Host, path: str, warn: Callable[[str], None]) -> _Record | None:
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
    return _Record(files, kept, {f for f in foreign if isinstance(f, str)},
                   h if isinstance(h, str) else None, t, stale=legacy or dropped)


async def _read_pending(host: Host, path: str) -> list[str] | None:
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


async def _remote_state(host: Host, trees: Sequence[Tree], records: Sequence[str],
                        verify: bool, warnings: list[str]) -> list[_Remote]:
    """The record of each tree; a scan (one command for all) where there is none, the last
    push did not finish, or verify. Which files push wrote comes from the record either way."""
    async def one(tree: Tree, path: str) -> tuple[_Remote, bool]:
        rec, pending = await asyncio.gather(_read_record(host, path, warnings.append),
                                            _read_pending(host, _pending_path(path)))
        state = _Remote({}, rec.hash if rec else None, owned=rec.owned if rec else set(),
                        pending=pending is not None, foreign=rec.foreign if rec else set(),
                        rewrite=rec is None or rec.stale)
        recorded[path] = rec
        state.owned |= set(pending or ())  # an unfinished push was writing these: ours
        if rec is not None and not verify and pending is None:
            state.files = {**rec.kept, **rec.files}
            state.record_time, state.from_record = rec.time, True
            return state, False
        # nothing there yet: no need to scan
        return state, await host.transport.stat(tree.remote) is not None

    recorded: dict[str, _Record | None] = {}
    found = await asyncio.gather(*(one(t, r) for t, r in zip(trees, records, strict=False)))
    states = [s for s, _scan in found]
    missing = [i for i, (_s, scan) in enumerate(found) if scan]
    if missing:
        # verify re-reads every file; otherwise the record's hashes stand for unchanged files
        scanned = await _scan_remote(host, [trees[i] for i in missing],
                                     [None if verify else records[i] for i in missing],
                                     pyc=verify)
        for i, (files, temps, pyc) in zip(missing, scanned, strict=False):
            st, rec = states[i], recorded[records[i]]
            st.files, st.temps, st.pyc = files, temps, pyc
            if rec is not None:
                # a file changed on the host since we wrote it is the host user's now: no
                # --delete removes it (a local copy of it is still pushed over it)
                wrote = {**rec.kept, **rec.files}
                st.owned -= {rel for rel, v in files.items()
                             if rel in wrote and wrote[rel][2] != v[2]}
    return states


async def _scan_remote(host: Host, trees: Sequence[Tree], records: Sequence[str | None],
                       pyc: bool = False) -> list[tuple[Manifest, list[str], list[str]]]:
    """One command on the host scans every tree (manifest.py run through `python -c`): files,
    console temp files, and (pyc, for code trees) bytecode caches. Paths that would leave the
    tree are dropped."""
    source = Path(manifest_mod.__file__).read_text(encoding="utf-8")
    req = {"trees": [{"root": t.remote, "exclude": list(t.exclude), "record": r,
                      "pyc": pyc and t.code} for t, r in zip(trees, records, strict=False)]}
    try:
        res = await host.transport.run([host.cfg.python, "-c", source, "scan"],
                                       input=json.dumps(req), check=True, timeout=600)
    except CommandFailed as e:
        raise ConsoleError(f"{host.name}: cannot scan remote files with {host.cfg.python}: "
                           f"{e}") from e
    try:
        data = json.loads(res.stdout)["trees"]
        return [({k: v for k, v in dict(t["files"]).items() if safe_rel(k)},
                 [r for r in t.get("temps", []) if safe_rel(r)],
                 [r for r in t.get("pyc", []) if safe_rel(r)]) for t in data]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConsoleError(f"{host.name}: remote scan printed no manifest: "
                           f"{res.stdout[:200]!r}") from e


async def _clean_leftovers(host: Host, trees: Sequence[Tree], remote: Sequence[_Remote],
                           verify: bool) -> list[int]:
    """Remove what a scan found that is ours and useless: temp files of uploads whose console
    is gone (or of this process, when no other push of the tree is running here), and with
    verify the bytecode caches of the code trees (Python rebuilds them from the pushed sources;
    a truncated one breaks every import). Files removed per tree."""
    out = []
    paths: list[str] = []
    for tree, rem in zip(trees, remote, strict=True):
        stale = [rel for rel in rem.temps
                 if tempfiles.is_stale(posixpath.basename(rel))
                 or (tempfiles.is_own_process(posixpath.basename(rel))
                     and _ACTIVE.get((host.name, tree.remote), 0) <= 1)]
        pyc = rem.pyc if verify and tree.code else []
        paths += [posixpath.join(tree.remote, rel) for rel in stale + pyc]
        out.append(len(stale) + len(pyc))
    if paths:
        await host.transport.remove(paths)
    return out


async def _upload(host: Host, uploads: list[tuple[str, str]], sizes: dict[str, tuple[str, int]],
                  on_progress: ProgressFn | None) -> dict[str, int]:
    """Upload in batches (for progress); bytes sent per tree name."""
    per_tree: dict[str, int] = {}
    done = sent = 0
    batch: list[tuple[str, str]] = []
    batch_bytes = 0

    async def flush() -> None:
        nonlocal done, sent, batch, batch_bytes
        n = await host.transport.upload(batch)
        for src, _dst in batch:
            name, size = sizes[src]
            per_tree[name] = per_tree.get(name, 0) + size
        done, sent = done + len(batch), sent + n
        batch, batch_bytes = [], 0
        if on_progress is not None:
            on_progress(done, len(uploads), sent)

    for item in uploads:
        batch.append(item)
        batch_bytes += sizes[item[0]][1]
        if len(batch) >= UPLOAD_BATCH_FILES or batch_bytes >= UPLOAD_BATCH_BYTES:
            await flush()
    if batch:
        await flush()
    return per_tree


def git_commit(folder: Path) -> str | None:
    """HEAD of the git checkout holding folder (with "-dirty" when it has local changes)."""
    try:
        head = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--", "."],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
