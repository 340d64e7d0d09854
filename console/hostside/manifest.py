"""Tree manifests: {relative path: [size, mtime, sha256]} with gitignore-style excludes.

Standard library only and self-contained: the console imports it to scan the local side, and
runs this same file on the host as `python -c SOURCE scan` to scan the remote side (before
anything has been pushed there). On the host, the record of the last push (same format) serves
as a hash cache: a file whose size and whole-second mtime match its record is not re-read.

    stdin:  {"trees": [{"root": "/abs/dir", "exclude": ["*.pyc", ...], "record": "/abs/x.json",
                        "pyc": false}]}
    stdout: {"trees": [{"files": {...}, "record_hash": "..." | null, "temps": [rel, ...],
                        "pyc": [rel, ...]}]}

`temps` are files named like the console's upload temps (`.NAME.tmp-e3-...`), `pyc` (when
asked) the bytecode caches in the tree's `__pycache__` folders: this script only lists them;
the console decides what to remove. Without a record path nothing is taken from a cache (every
file is read: what `push --verify` wants).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import sys
from typing import Any, Dict, List, Optional, Tuple

# path -> [size, mtime, sha256]
Manifest = Dict[str, List[Any]]

#: excluded from every tree: version control, bytecode and our own temp names
DEFAULT_EXCLUDE = [".git/", "__pycache__/", "*.pyc", ".*.tmp-*"]
_BLOCK = 1024 * 1024


class Ignore:
    """A .gitignore-style pattern list: `#` comments, `!` re-includes, a trailing `/` matches
    folders only, a pattern with a `/` is anchored at the tree root (else it matches a name at
    any depth), `*` and `?` stay within one path part, `**` spans parts. Last match wins, and
    nothing under an excluded folder can be re-included (as in git)."""

    def __init__(self, patterns: List[str]) -> None:
        self.rules: List[Tuple[Any, bool, bool]] = []  # (regex, negated, folders only)
        for raw in patterns:
            pat = raw.rstrip("\n")
            if not pat.strip() or pat.startswith("#"):
                continue
            neg = pat.startswith("!")
            if neg:
                pat = pat[1:]
            dir_only = pat.endswith("/")
            pat = pat.rstrip("/")
            anchored = "/" in pat
            pat = pat.lstrip("/")
            body = _glob_regex(pat)
            rx = re.compile(("" if anchored else "(?:.*/)?") + body + r"\Z", re.DOTALL)
            self.rules.append((rx, neg, dir_only))

    def excluded(self, rel: str, is_dir: bool) -> bool:
        """Whether the path (relative, `/`-separated) is excluded by the rules themselves."""
        verdict = False
        for rx, neg, dir_only in self.rules:
            if dir_only and not is_dir:
                continue
            if rx.match(rel):
                verdict = not neg
        return verdict


def _glob_regex(pat: str) -> str:
    out, i, n = [], 0, len(pat)
    while i < n:
        c = pat[i]
        if pat.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pat.startswith("/**", i) and i + 3 == n:
            out.append("/.*")
            i += 3
        elif pat.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            j = pat.find("]", i + 2)
            if j < 0:
                out.append(re.escape(c))
                i += 1
            else:
                cls = pat[i + 1:j].replace("\\", "\\\\")
                out.append("[" + ("^" + cls[1:] if cls.startswith("!") else cls) + "]")
                i = j + 1
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(pat[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(_BLOCK)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


#: a temp file the console's uploads write (console/transport/tempfiles.py judges it exactly)
_CONSOLE_TEMP = re.compile(r"\A\..+\.tmp-e3-[0-9a-f]{8}-[0-9]+-[0-9]+-[0-9a-f]{8}\Z", re.DOTALL)


def walk(root: str, exclude: List[str],
         extras: Optional[Dict[str, List[str]]] = None) -> Dict[str, Tuple[int, float]]:
    """{rel: (size, mtime)} of every regular file under root not excluded (symlinks to files
    count as files; symlinked folders are not entered). A missing root is an empty tree.

    With `extras`, also lists (never as part of the tree) the console's temp files under
    extras["temps"] and the bytecode caches (`__pycache__/*.pyc`) under extras["pyc"]."""
    ignore = Ignore(DEFAULT_EXCLUDE + list(exclude))
    out: Dict[str, Tuple[int, float]] = {}

    def caches(abs_dir: str, rel_dir: str) -> None:
        assert extras is not None
        try:
            for e in os.scandir(abs_dir):
                if e.name.endswith(".pyc") and e.is_file(follow_symlinks=False):
                    extras["pyc"].append(rel_dir + e.name)
        except OSError:
            pass

    def visit(abs_dir: str, rel_dir: str) -> None:
        try:
            entries = list(os.scandir(abs_dir))
        except (FileNotFoundError, NotADirectoryError):
            return
        for e in entries:
            rel = rel_dir + e.name
            try:
                if e.is_dir(follow_symlinks=False):
                    if not ignore.excluded(rel, True):
                        visit(e.path, rel + "/")
                    elif extras is not None and e.name == "__pycache__":
                        caches(e.path, rel + "/")
                    continue
                st = e.stat()  # follows a symlink to a file
            except OSError:
                continue  # vanished or dangling: not part of the tree
            if not stat.S_ISREG(st.st_mode):
                continue
            if not ignore.excluded(rel, False):
                out[rel] = (st.st_size, st.st_mtime)
            elif extras is not None and _CONSOLE_TEMP.match(e.name):
                extras["temps"].append(rel)

    visit(root, "")
    return out


def scan(root: str, exclude: List[str], cache: Optional[Manifest] = None,
         extras: Optional[Dict[str, List[str]]] = None) -> Manifest:
    """walk() plus each file's sha256; a file whose size and whole-second mtime match its
    `cache` entry keeps that entry's hash without being read."""
    out: Manifest = {}
    cache = cache or {}
    for rel, (size, mtime) in walk(root, exclude, extras).items():
        hit = cache.get(rel)
        if hit and hit[0] == size and int(hit[1]) == int(mtime):
            digest = hit[2]
        else:
            try:
                digest = sha256_file(os.path.join(root, rel))
            except OSError:
                continue
        out[rel] = [size, mtime, digest]
    return out


def manifest_hash(files: Manifest) -> str:
    """Content identity of a tree: paths, sizes and hashes (not mtimes)."""
    h = hashlib.sha256()
    for rel in sorted(files):
        size, _mtime, digest = files[rel][:3]
        h.update(f"{rel}\0{size}\0{digest}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _read_record(path: Optional[str]) -> Tuple[Manifest, Optional[str]]:
    if not path:
        return {}, None
    try:
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
        return dict(rec.get("files") or {}), rec.get("hash")
    except (OSError, ValueError, AttributeError):
        return {}, None


def main(argv: List[str]) -> int:
    if argv[1:2] != ["scan"]:
        sys.stderr.write("usage: manifest.py scan < {\"trees\": [...]}\n")
        return 2
    req = json.load(sys.stdin)
    trees = []
    for t in req["trees"]:
        cache, record_hash = _read_record(t.get("record"))
        extras = {"temps": [], "pyc": []}  # type: Dict[str, List[str]]
        files = scan(os.path.expanduser(t["root"]), t.get("exclude") or [], cache, extras)
        trees.append({"files": files, "record_hash": record_hash, "temps": extras["temps"],
                      "pyc": extras["pyc"] if t.get("pyc") else []})
    json.dump({"trees": trees}, sys.stdout, separators=(",", ":"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
