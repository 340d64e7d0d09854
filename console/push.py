"""Incremental push: send a host the files that changed, and nothing else.

A push covers trees (local folder -> remote folder). The engine package (this checkout's
`engine/`, found via `engine.__file__`) and the host helpers (`console/hostside/`) are always
among them, to ROOT/code/engine and ROOT/code/eagle3_hostside; sync sets from the config go to
their own remote folders. For each tree:

1. both sides are scanned into a manifest {path: [size, mtime, sha256]} with the same
   gitignore-style excludes (the remote scan is console/hostside/manifest.py run by the host's
   Python, all trees in one command; the record of the last push spares it re-reading files);
2. files whose size or sha256 differ (or that are missing remotely) are uploaded over the one
   connection, each to a temp name then renamed (Transport.upload), keeping mtime and mode;
3. with `delete`, remote files that vanished locally are removed (excluded files never are);
4. the record ROOT/manifests/<key>.json (files, content hash, local git commit) is rewritten,
   so a run can say exactly which code it ran.

A second push with no local change therefore costs one remote command and sends nothing.
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
from console.hostside.manifest import Manifest, manifest_hash, scan

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


async def push(host: Host, trees: Sequence[Tree], *, delete: bool = False,
               on_progress: ProgressFn | None = None) -> PushReport:
    """Bring every tree on host up to date with the local side (see the module docstring)."""
    await host.connect()
    root = await host.root()
    records = [_record_path(root, t) for t in trees]
    local_task = asyncio.ensure_future(asyncio.to_thread(_scan_local, trees))
    try:
        remote = await _scan_remote(host, trees, records)
    finally:
        local = await local_task
    report = PushReport(host.name)
    uploads: list[tuple[str, str]] = []
    removals: list[str] = []
    plans: list[tuple[Tree, Manifest, int, int, int, bool]] = []
    for tree, files, (rfiles, rhash) in zip(trees, local, remote):
        send = [rel for rel, (size, _m, digest) in files.items()
                if rel not in rfiles or rfiles[rel][0] != size or rfiles[rel][2] != digest]
        gone = [rel for rel in rfiles if rel not in files]
        uploads += [(str(tree.local / rel), posixpath.join(tree.remote, rel)) for rel in send]
        if delete:
            removals += [posixpath.join(tree.remote, rel) for rel in gone]
        stale = bool(send) or (delete and bool(gone)) or rhash != manifest_hash(files)
        plans.append((tree, files, len(send), len(gone) if delete else 0,
                      0 if delete else len(gone), stale))
    sent_bytes = await _upload(host, uploads, local, trees, on_progress)
    if removals:
        await host.transport.remove(removals)
    gits = await asyncio.gather(*(asyncio.to_thread(git_commit, t.local) for t in trees))
    writes = []
    for (tree, files, n_sent, n_del, n_extra, stale), rec, git in zip(plans, records, gits):
        h = manifest_hash(files)
        report.trees.append(TreeResult(tree.name, tree.remote, len(files), n_sent,
                                       sent_bytes.get(tree.name, 0), n_del, n_extra, h, git))
        if stale:
            body = {"name": tree.name, "local": str(tree.local), "remote": tree.remote, "hash": h,
                    "git": git, "time": time.time(), "files": files}
            writes.append(host.transport.write_bytes(rec, json.dumps(body).encode()))
    await asyncio.gather(*writes)
    return report


def _record_path(root: str, tree: Tree) -> str:
    key = hashlib.sha1(tree.remote.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    base = posixpath.basename(tree.remote.rstrip("/")) or "root"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in base)
    return posixpath.join(root, "manifests", f"{safe}-{key}.json")


def _scan_local(trees: Sequence[Tree]) -> list[Manifest]:
    out = []
    for t in trees:
        if not t.local.is_dir():
            raise ConfigError(f"{t.name}: local folder {t.local} does not exist")
        out.append(scan(str(t.local), list(t.exclude)))
    return out


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


async def _upload(host: Host, uploads: list[tuple[str, str]], local: list[Manifest],
                  trees: Sequence[Tree], on_progress: ProgressFn | None) -> dict[str, int]:
    """Upload in batches (for progress); bytes sent per tree name."""
    if not uploads:
        return {}
    owner: dict[str, str] = {}
    size: dict[str, int] = {}
    for t, files in zip(trees, local):
        for rel, (n, _m, _d) in files.items():
            src = str(t.local / rel)
            owner[src], size[src] = t.name, n
    per_tree: dict[str, int] = {}
    done = sent = 0
    batch: list[tuple[str, str]] = []
    batch_bytes = 0

    async def flush() -> None:
        nonlocal done, sent, batch, batch_bytes
        n = await host.transport.upload(batch)
        for src, _dst in batch:
            per_tree[owner[src]] = per_tree.get(owner[src], 0) + size[src]
        done, sent = done + len(batch), sent + n
        batch, batch_bytes = [], 0
        if on_progress is not None:
            on_progress(done, len(uploads), sent)

    for item in uploads:
        batch.append(item)
        batch_bytes += size[item[0]]
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
