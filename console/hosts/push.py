"""Incremental push: send a host the files that changed, and nothing else.

A push covers trees (local folder -> remote folder): always this checkout's `engine/` (found
without importing it) and `console/hostside/`, to ROOT/code/engine and ROOT/code/eagle3_hostside,
plus sync sets from the config, each to its own remote folder (never `/`, ROOT or above it, nor
inside ROOT/code, ROOT/runs or ROOT/manifests: console/settings/config.py refuses those, and
sync_tree checks again once `~` is resolved). For each tree:

1. the local side is walked (gitignore-style excludes) into a manifest {path: [size, mtime,
   sha256]} and compared with the record of the last push, ROOT/manifests/<key>.json, read over
   SFTP (no command run, so a slow login shell costs nothing). A file whose size and mtime equal
   its recorded entry keeps the recorded hash (rsync's quick check, with git's guard for edits
   in the same clock tick); any other file is hashed;
2. files whose size or sha256 differ from the record (or are not in it) are uploaded
   (Transport.upload: a temp name, then a rename; mtime and mode kept). A note,
   ROOT/manifests/<key>.pending, names them from before the first upload until the push is done;
3. with `delete`, files gone locally are removed remotely, but only files a push wrote: the
   record's `files` less its `foreign` list (found at the remote, identical, never written by
   us) and `kept` (written earlier, gone locally, not yet deleted). Files changed on the host
   since we wrote them (seen by a scan) are left alone; record entries that are not paths inside
   the tree (`..`, absolute) are ignored with a warning;
4. the record is rewritten (files, content hash, local git commit): a run can name its code.

Without a record, after an unfinished push (the .pending note) or with `verify`, the remote
folder is scanned instead (console/hostside/manifest.py with the host's Python, one command for
all trees, none when the folder does not exist yet), which also repairs files edited on the host;
`verify` re-reads every file and clears the code trees' bytecode caches. A scan also finds the
console's upload temps (console/transport/tempfiles.py): those of a console process that is gone
are removed. With no local change a push reads one small file per tree and sends nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
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
from console.errors import CommandFailed, ConfigError, ConsoleError
from console.hosts.push_records import (
    RECORD_VERSION,
    Record,
    pending_path,
    read_pending,
    read_record,
    record_path,
    safe_rel,
)
from console.hostside.manifest import Manifest, manifest_hash, sha256_file, walk
from console.settings.config import Config, SyncSet, sync_remote_problem
from console.transport import tempfiles

if TYPE_CHECKING:
    from console.hosts.host import Host


def _package_dir(name: str) -> Path:
    """A top-level package's folder, found without importing (running) it: the console imports
    only the engine's contract modules."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"no package {name!r} beside the console")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


ENGINE_DIR = _package_dir("engine")
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

#: the trees engine_trees gives: a push that sent both has put this console's engine on the host
ENGINE_TREES = frozenset({"engine", "hostside"})


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
class _TreePush:
    """One tree on its way through a push: what each step found and decided for it."""

    tree: Tree
    record: str                          # its push record on the host
    remote: _Remote                      # what the host has
    local: dict[str, tuple[int, float]]  # the local walk: {rel: (size, mtime)}
    cleaned: int = 0                     # leftovers removed (_clean_leftovers)
    manifest: Manifest = field(default_factory=dict)  # the local manifest, as hashed so far
    to_hash: list[str] = field(default_factory=list)  # same size as the remote's: hash decides
    later: list[str] = field(default_factory=list)    # new or resized: sent, hashed meanwhile
    changed: list[str] = field(default_factory=list)  # of to_hash, those whose hash differs
    gone: list[str] = field(default_factory=list)     # remote only, a push wrote it: deletable
    foreign_left: int = 0                # remote only, no push wrote them: never deleted
    sent_bytes: int = 0                  # bytes uploaded

    @property
    def send(self) -> list[str]:
        """The files to upload."""
        return self.changed + self.later

    def classify(self) -> None:
        """Which local files need their hash before we can tell whether they changed (one whose
        size and mtime equal its recorded entry keeps the recorded hash), and which remote-only
        files an earlier push wrote (only those may be deleted)."""
        rem = self.remote
        extra = [rel for rel in rem.files if rel not in self.local]
        self.gone = [rel for rel in extra if rel in rem.owned]
        self.foreign_left = len(extra) - len(self.gone)
        for rel, (size, mtime) in self.local.items():
            r = rem.files.get(rel)
            if (r and rem.from_record and r[0] == size and r[1] == mtime
                    and mtime < rem.record_time - RACY_WINDOW):
                self.manifest[rel] = [size, mtime, r[2]]  # unchanged since the last push
            elif r and r[0] == size:
                self.to_hash.append(rel)
            else:
                self.later.append(rel)

    def finish(self, git: str | None, delete: bool, scan_time: float
               ) -> tuple[TreeResult, dict[str, Any] | None]:
        """What pushing the tree did, and its new record (None: the old one still holds)."""
        tree, man, rem, gone = self.tree, self.manifest, self.remote, self.gone
        sent = set(self.send)
        h = manifest_hash(man)
        removed = len(gone) if delete else 0
        result = TreeResult(tree.name, tree.remote, len(man), len(sent), self.sent_bytes,
                            removed, 0 if delete else len(gone), h, git, self.foreign_left,
                            self.cleaned)
        # files pushed before, gone locally but kept remotely: remembered for a later --delete
        kept = {} if delete else {rel: rem.files[rel] for rel in gone}
        # local files found already at the remote (same content) that no push of ours wrote
        foreign = sorted(rel for rel in man if rel not in rem.owned and rel not in sent)
        unchanged = (rem.from_record and rem.record_hash == h and not removed
                     and rem.files == {**man, **kept} and set(foreign) == rem.foreign
                     and not rem.pending and not rem.rewrite)
        if unchanged:
            return result, None
        return result, {"v": RECORD_VERSION, "name": tree.name, "local": str(tree.local),
                        "remote": tree.remote, "hash": h, "git": git, "time": scan_time,
                        "files": man, "kept": kept, "foreign": foreign}


#: pushes in flight in this process, per (host, remote folder): a temp file of this very process
#: is an orphan (of a dropped connection) only when no other push of that tree is running
_ACTIVE: dict[tuple[str, str], int] = {}


async def push(host: Host, trees: Sequence[Tree], *, delete: bool = False, verify: bool = False,
               on_progress: ProgressFn | None = None) -> PushReport:
    """Bring every tree on host up to date with the local side (the module docstring says how)."""
    await host.connect()
    root = await host.root()
    keys = [(host.name, t.remote) for t in trees]
    for k in keys:
        _ACTIVE[k] = _ACTIVE.get(k, 0) + 1
    try:
        report = await _push(host, root, trees, delete, verify, on_progress)
        if {t.name for t in trees if t.code} >= ENGINE_TREES:
            host.engine_pushed = True   # this console's engine is on the host now
        return report
    finally:
        for k in keys:
            _ACTIVE[k] -= 1
            if not _ACTIVE[k]:
                del _ACTIVE[k]


async def _push(host: Host, root: str, trees: Sequence[Tree], delete: bool, verify: bool,
                on_progress: ProgressFn | None) -> PushReport:
    report = PushReport(host.name)
    scan_time = time.time()
    pushes = await _survey(host, root, trees, verify, report.warnings)
    await asyncio.to_thread(_hash_all, [(p, p.to_hash) for p in pushes])
    for p in pushes:
        p.changed = [rel for rel in p.to_hash if p.remote.files[rel][2] != p.manifest[rel][2]]
    # an interrupted push leaves this note: the next push scans (and cleans up its temps)
    await asyncio.gather(*(host.transport.write_bytes(pending_path(p.record), json.dumps(
        {"owner": tempfiles.owner(), "time": scan_time, "send": p.send}).encode())
        for p in pushes if p.send))
    relinked = await _send(host, pushes, on_progress)
    if delete:
        removals = [posixpath.join(p.tree.remote, rel) for p in pushes for rel in p.gone]
        if removals:
            await host.transport.remove(removals)
    await _write_records(host, pushes, delete, scan_time, report)
    # after a relink the note of a tree that sent files stays: the next push scans for temps
    done = [pending_path(p.record) for p in pushes
            if (p.remote.pending or p.send) and not (relinked and p.send)]
    if done:
        await host.transport.remove(done)
    return report


async def _survey(host: Host, root: str, trees: Sequence[Tree], verify: bool,
                  warnings: list[str]) -> list[_TreePush]:
    """Walk the local trees while the host's state of each is read, clean up the leftovers a
    scan found, and sort each tree's files: known unchanged, to hash, to send."""
    records = [record_path(root, t.remote) for t in trees]
    local_task = asyncio.ensure_future(asyncio.to_thread(_walk_local, trees))
    try:
        remote = await _remote_state(host, trees, records, verify, warnings)
    finally:
        walked = await local_task
    cleaned = await _clean_leftovers(host, trees, remote, verify)
    pushes = [_TreePush(*row) for row in zip(trees, records, remote, walked, cleaned, strict=True)]
    for p in pushes:
        p.classify()
    return pushes


async def _send(host: Host, pushes: Sequence[_TreePush], on_progress: ProgressFn | None) -> bool:
    """Upload every tree's files to send, hashing the new ones meanwhile. True when the link
    dropped and uploads were retried on a new one: temps of the old link may be left."""
    files = [(p, rel) for p in pushes for rel in p.changed] + \
        [(p, rel) for p in pushes for rel in p.later]
    hashing = asyncio.ensure_future(asyncio.to_thread(_hash_all, [(p, p.later) for p in pushes]))
    connects = host.transport.connects
    try:
        await _upload(host, files, on_progress)
    finally:
        await hashing
    return host.transport.connects != connects


async def _write_records(host: Host, pushes: Sequence[_TreePush], delete: bool,
                         scan_time: float, report: PushReport) -> None:
    """Report every tree; rewrite the record of each that changed."""
    gits = await asyncio.gather(*(asyncio.to_thread(git_commit, p.tree.local) for p in pushes))
    writes = []
    for p, git in zip(pushes, gits, strict=True):
        result, body = p.finish(git, delete, scan_time)
        report.trees.append(result)
        if body is not None:
            writes.append(host.transport.write_bytes(p.record, json.dumps(body).encode()))
    await asyncio.gather(*writes)


def _walk_local(trees: Sequence[Tree]) -> list[dict[str, tuple[int, float]]]:
    out = []
    for t in trees:
        if not t.local.is_dir():
            raise ConfigError(f"{t.name}: local folder {t.local} does not exist")
        out.append(walk(str(t.local), list(t.exclude)))
    return out


def _hash_all(work: Sequence[tuple[_TreePush, Sequence[str]]]) -> None:
    for p, rels in work:
        for rel in rels:
            size, mtime = p.local[rel]
            p.manifest[rel] = [size, mtime, sha256_file(str(p.tree.local / rel))]


async def _remote_state(host: Host, trees: Sequence[Tree], records: Sequence[str],
                        verify: bool, warnings: list[str]) -> list[_Remote]:
    """The record of each tree; a scan (one command for all) where there is none, the last
    push did not finish, or verify. Which files push wrote comes from the record either way."""
    async def one(tree: Tree, path: str) -> tuple[_Remote, bool]:
        rec, pending = await asyncio.gather(read_record(host, path, warnings.append),
                                            read_pending(host, pending_path(path)))
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

    recorded: dict[str, Record | None] = {}
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


async def _upload(host: Host, files: Sequence[tuple[_TreePush, str]],
                  on_progress: ProgressFn | None) -> None:
    """Upload in batches (progress is reported between them), counting each tree's bytes."""
    done = sent = batch_bytes = 0
    for end, (p, rel) in enumerate(files, 1):
        batch_bytes += p.local[rel][0]
        if (end - done < UPLOAD_BATCH_FILES and batch_bytes < UPLOAD_BATCH_BYTES
                and end < len(files)):
            continue
        batch = files[done:end]
        sent += await host.transport.upload(
            [(str(q.tree.local / r), posixpath.join(q.tree.remote, r)) for q, r in batch])
        for q, r in batch:
            q.sent_bytes += q.local[r][0]
        done, batch_bytes = end, 0
        if on_progress is not None:
            on_progress(done, len(files), sent)


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
