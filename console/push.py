"""Incremental push: send a host the files that changed, and nothing else.

A push covers trees (local folder -> remote folder). The engine package (this checkout's
`engine/`, found via `engine.__file__`) and the host helpers (`console/hostside/`) are always
among them, to ROOT/code/engine and ROOT/code/eagle3_hostside; sync sets from the config go to
their own remote folders. For each tree:

1. the local side is walked with gitignore-style excludes into a manifest
   {path: [size, mtime, sha256]}; the host's copy of the manifest is the record of the last
   push, ROOT/manifests/<key>.json, read over SFTP (no command run, so a slow login shell on
   the host costs nothing). A local file whose size and mtime equal its recorded entry keeps
   the recorded hash (rsync's quick check, with git's guard for edits in the same clock tick);
   any other file is hashed;
2. files whose size or sha256 differ from the record (or are not in it) are uploaded over the
   one connection, each to a temp name then renamed (Transport.upload), keeping mtime and mode;
3. with `delete`, files of the previous push that vanished locally are removed remotely
   (files the console never pushed, and excluded ones, are left alone);
4. the record is rewritten (files, content hash, local git commit), so a run can say exactly
   which code it ran.

Without a record (a first push, a lost record) or with `verify`, the remote folder is scanned
instead by console/hostside/manifest.py run with the host's Python (one command for all trees,
skipped when the folder does not exist yet): that also repairs files edited on the host behind
the console's back. A second push with no local change reads one small file per tree and sends
nothing.
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
from console.config import Config, SyncSet
from console.errors import CommandFailed, ConfigError, ConsoleError
from console.hostside.manifest import Manifest, manifest_hash, sha256_file, walk

if TYPE_CHECKING:
    from console.host import Host

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


@dataclass
class PushReport:
    """A whole push: every tree, and one hash naming the code a run will use."""

    host: str
    trees: list[TreeResult] = field(default_factory=list)

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
    return [Tree("engine", ENGINE_DIR, posixpath.join(code, "engine")),
            Tree("hostside", HOSTSIDE_DIR, posixpath.join(code, HOSTSIDE_PACKAGE))]


async def sync_tree(host: Host, sync: SyncSet) -> Tree:
    local = Path(sync.local).expanduser()
    if not local.is_dir():
        raise ConfigError(f"[sync.{sync.name}] local: {local} is not a folder")
    return Tree(sync.name, local, await host.resolve(sync.remote), tuple(sync.exclude))


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
    """What the host has for one tree."""

    files: Manifest              # from the push record, or from a scan of the remote folder
    record_hash: str | None      # hash stored in the record (None: no record)
    record_time: float = 0.0     # when the recorded local scan happened
    from_record: bool = False    # entries carry the *local* mtimes of the last push


async def push(host: Host, trees: Sequence[Tree], *, delete: bool = False, verify: bool = False,
               on_progress: ProgressFn | None = None) -> PushReport:
    """Bring every tree on host up to date with the local side (see the module docstring).

    The host's copy of the manifest is the record of the last push (one SFTP read, no command
    run). Where there is no record the remote folder is scanned (or known empty); `verify`
    always scans, to repair files changed on the host behind the console's back."""
    await host.connect()
    root = await host.root()
    records = [_record_path(root, t) for t in trees]
    scan_time = time.time()
    local_task = asyncio.ensure_future(asyncio.to_thread(_walk_local, trees))
    try:
        remote = await _remote_state(host, trees, records, verify)
    finally:
        walked = await local_task
    # which files need their hash before we can tell whether they changed
    known: list[Manifest] = []
    to_hash: list[tuple[int, str]] = []
    later: list[tuple[int, str]] = []            # sent whatever their hash: hashed meanwhile
    for i, (files, rem) in enumerate(zip(walked, remote)):
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
    uploads = [(str(trees[i].local / rel), posixpath.join(trees[i].remote, rel)) for i, rel in send]
    sizes = {str(trees[i].local / rel): (trees[i].name, walked[i][rel][0]) for i, rel in send}
    hashing = asyncio.ensure_future(asyncio.to_thread(_hash_into, trees, walked, known, later))
    try:
        per_tree = await _upload(host, uploads, sizes, on_progress)
    finally:
        await hashing
    gone = [[rel for rel in rem.files if rel not in walked[i]] for i, rem in enumerate(remote)]
    if delete:
        removals = [posixpath.join(trees[i].remote, rel) for i, g in enumerate(gone) for rel in g]
        if removals:
            await host.transport.remove(removals)
    gits = await asyncio.gather(*(asyncio.to_thread(git_commit, t.local) for t in trees))
    report = PushReport(host.name)
    n_sent = {i: 0 for i in range(len(trees))}
    for i, _rel in send:
        n_sent[i] += 1
    writes = []
    for i, (tree, man, rem, rec, git) in enumerate(zip(trees, known, remote, records, gits)):
        h = manifest_hash(man)
        removed = len(gone[i]) if delete else 0
        report.trees.append(TreeResult(tree.name, tree.remote, len(man), n_sent[i],
                                       per_tree.get(tree.name, 0), removed,
                                       0 if delete else len(gone[i]), h, git))
        # files pushed before, gone locally but kept remotely: remembered for a later --delete
        kept = {} if delete else {rel: rem.files[rel] for rel in gone[i]}
        unchanged = (rem.from_record and rem.record_hash == h and not removed
                     and rem.files == {**man, **kept})
        if not unchanged:
            body = {"name": tree.name, "local": str(tree.local), "remote": tree.remote, "hash": h,
                    "git": git, "time": scan_time, "files": man, "kept": kept}
            writes.append(host.transport.write_bytes(rec, json.dumps(body).encode()))
    await asyncio.gather(*writes)
    return report


def _record_path(root: str, tree: Tree) -> str:
    key = hashlib.sha1(tree.remote.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    base = posixpath.basename(tree.remote.rstrip("/")) or "root"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in base)
    return posixpath.join(root, "manifests", f"{safe}-{key}.json")


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


async def _remote_state(host: Host, trees: Sequence[Tree], records: Sequence[str],
                        verify: bool) -> list[_Remote]:
    """The record of each tree; a scan (one command for all) where there is none or verify."""
    async def from_record(tree: Tree, path: str) -> _Remote | None:
        if verify:
            return None
        st = await host.transport.stat(path)
        if st is not None:
            try:
                rec = json.loads(await host.transport.read_range(path, 0, st.size))
                files = {**rec.get("kept", {}), **rec["files"]}
                return _Remote(files, rec.get("hash"), float(rec.get("time", 0)),
                               from_record=True)
            except (ValueError, KeyError, TypeError, CommandFailed):
                return None                   # unreadable record: scan instead
        if await host.transport.stat(tree.remote) is None:
            return _Remote({}, None)          # nothing there yet: no need to scan
        return None

    states = list(await asyncio.gather(*(from_record(t, r) for t, r in zip(trees, records))))
    missing = [i for i, s in enumerate(states) if s is None]
    if missing:
        scanned = await _scan_remote(host, [trees[i] for i in missing],
                                     [records[i] for i in missing])
        for i, (files, rhash) in zip(missing, scanned):
            states[i] = _Remote(files, rhash)
    return [s for s in states if s is not None]


async def _scan_remote(host: Host, trees: Sequence[Tree], records: Sequence[str]
                       ) -> list[tuple[Manifest, str | None]]:
    """One command on the host scans every tree (manifest.py run through `python -c`)."""
    source = Path(manifest_mod.__file__).read_text(encoding="utf-8")
    req = {"trees": [{"root": t.remote, "exclude": list(t.exclude), "record": r}
                     for t, r in zip(trees, records)]}
    try:
        res = await host.transport.run([host.cfg.python, "-c", source, "scan"],
                                       input=json.dumps(req), check=True, timeout=600)
    except CommandFailed as e:
        raise ConsoleError(f"{host.name}: cannot scan remote files with {host.cfg.python}: "
                           f"{e}") from e
    try:
        data = json.loads(res.stdout)["trees"]
        return [(dict(t["files"]), t.get("record_hash")) for t in data]
    except (ValueError, KeyError, TypeError) as e:
        raise ConsoleError(f"{host.name}: remote scan printed no manifest: "
                           f"{res.stdout[:200]!r}") from e


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
