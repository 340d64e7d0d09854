"""sha256 of weight files, remembered by file identity.

Provenance records the sha256 of every source weight file, and hashing is the slowest part of a
conversion (OpenSSL's SHA-256 runs at about 1.4 GB/s a core; the kernel copies faster). Users
convert one source several times in a row (vllm, sglang, speculators), so the digest is kept in
a small cache keyed, as git's index and DVC key theirs, by the file's identity: real path,
device, inode, size, mtime and ctime in nanoseconds. Any write to the file changes its ctime
(which no user call can set back), so a changed file is always hashed again. A file modified in
the last two seconds is not cached (a write in the same clock tick could leave the stamps equal),
nor is one whose stamps changed while it was being hashed.

The cache is `$XDG_CACHE_HOME/eagle3-engine/sha256.json` (bounded, rewritten atomically); set
EAGLE3_HASH_CACHE=0 to always hash. Provenance says which digests came from the cache.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from engine.errors import EngineError
from engine.fileio import read_json, sha256_file, write_json

MAX_ENTRIES = 2000
FRESH_S = 2.0  # files younger than this are hashed but not remembered


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "eagle3-engine" / "sha256.json"


def enabled() -> bool:
    flag = os.environ.get("EAGLE3_HASH_CACHE", "1").strip().lower()
    return flag not in ("0", "off", "no", "false")


def _identity(path: Path) -> tuple[str, os.stat_result]:
    st = os.stat(path)
    key = "|".join(str(x) for x in (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size,
                                    st.st_mtime_ns, st.st_ctime_ns))
    return key, st


def _load() -> dict[str, str]:
    try:
        data = read_json(cache_path())
    except EngineError:
        return {}  # absent or damaged: start afresh (it only ever saves time)
    return {k: v for k, v in data.items()
            if isinstance(k, str) and isinstance(v, str) and len(v) == 64}


def _store(new: dict[str, str]) -> None:
    entries = _load()
    for k in new:
        entries.pop(k, None)
    entries.update(new)  # newest last; the oldest go first when the cache is full
    keep = dict(list(entries.items())[-MAX_ENTRIES:])
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, keep, indent=None)
    except OSError:
        pass  # a read-only home only costs the next run a hash


def sha256_files(paths: list[Path]) -> dict[str, tuple[str, bool]]:
    """str(path) -> (hex digest, whether it came from the cache), for every path."""
    use = enabled()
    known = _load() if use else {}
    out: dict[str, tuple[str, bool]] = {}
    learned: dict[str, str] = {}
    for p in paths:
        key, st = _identity(p)
        if key in known:
            out[str(p)] = (known[key], True)
            continue
        started = time.time()
        digest = sha256_file(p)
        out[str(p)] = (digest, False)
        after, _ = _identity(p)
        if use and after == key and started - st.st_ctime_ns / 1e9 > FRESH_S:
            learned[key] = digest
    if learned:
        _store(learned)
    return out


class HashInBackground:
    """sha256 of several files on a thread, overlapping the caller's own I/O (hashlib releases
    the GIL); digests the cache already holds cost nothing."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self._result: dict[str, tuple[str, bool]] = {}
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = sha256_files(self.paths)
        except BaseException as e:  # reported by result()
            self._error = e

    def result(self) -> dict[str, tuple[str, bool]]:
        """File name -> (hex digest, from the cache); waits for the thread."""
        self._thread.join()
        if self._error is not None:
            raise EngineError(f"hashing failed: {self._error}")
        return {Path(k).name: v for k, v in self._result.items()}


def sha256_by_name(paths: list[Path]) -> dict[str, str]:
    """File name -> hex digest (cached where possible), for provenance records."""
    return {Path(k).name: d for k, (d, _) in sha256_files(paths).items()}
