"""Find checkpoint folders on the host (standard library only; runs on the host).

console/checkpoints/service.py sends this file's source through `python -c` (nothing needs to
be pushed first) with the request on stdin, and reads one JSON list on stdout:

    stdin:  {"roots": [[folder, source, per_child], ...], "depth": N, "max": N}
    stdout: {"found": [{"path", "source", "mtime", "bytes"}, ...],
             "missing": [[folder, why], ...]}

A configured root ("configured" source) that is not a readable folder is listed in `missing`
with the reason (no such folder, not a folder, permission denied), so the console can say so;
the run and conversion roots are simply absent until something is written there.

A checkpoint is a folder holding config.json and weights (*.safetensors, a sharded index or
pytorch_model.bin); it is listed once (by its real path) and not looked inside. Other folders
are walked down to `depth` levels, hidden ones skipped, until `max` checkpoints are found. A
root with per_child is one source per child folder ("run <child>"), each walked on its own.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Set

WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def is_ckpt(d: str, names: Sequence[str]) -> bool:
    if "config.json" not in names:
        return False
    return any(n in names for n in WEIGHTS) or any(n.endswith(".safetensors") for n in names)


class Scan(object):
    """The checkpoints found so far (at most `limit`), each real path once."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.out: List[Dict[str, Any]] = []
        self.seen: Set[str] = set()

    def add(self, d: str, source: str) -> None:
        real = os.path.realpath(d)
        if real in self.seen or len(self.out) >= self.limit:
            return
        self.seen.add(real)
        try:
            st = os.stat(d)
            size = sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d)
                       if os.path.isfile(os.path.join(d, n)))
        except OSError:
            return
        self.out.append({"path": d, "source": source, "mtime": st.st_mtime, "bytes": size})

    def walk(self, d: str, source: str, depth: int) -> None:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            return
        if is_ckpt(d, names):
            self.add(d, source)
            return
        if depth <= 0:
            return
        for n in names:
            p = os.path.join(d, n)
            if not n.startswith(".") and os.path.isdir(p):
                self.walk(p, source, depth - 1)


def unreadable(root: str) -> Optional[str]:
    """Why a folder cannot be scanned (None: it can)."""
    if not os.path.exists(root):
        return "no such folder"
    if not os.path.isdir(root):
        return "not a folder"
    if not os.access(root, os.R_OK | os.X_OK):
        return "permission denied"
    return None


def scan(req: Dict[str, Any]) -> Dict[str, Any]:
    found = Scan(req["max"])
    missing = []  # type: List[List[str]]
    for root, source, per_child in req["roots"]:
        why = unreadable(root) if source == "configured" else None
        if why is not None:
            missing.append([root, why])
            continue
        if not per_child:
            found.walk(root, source, req["depth"])
            continue
        try:
            kids = sorted(os.listdir(root))
        except OSError:
            continue
        for k in kids:
            if not k.startswith(".") and os.path.isdir(os.path.join(root, k)):
                found.walk(os.path.join(root, k), source + " " + k, req["depth"])
    return {"found": found.out, "missing": missing}


def main() -> None:
    print(json.dumps(scan(json.load(sys.stdin))))


if __name__ == "__main__":
    main()
