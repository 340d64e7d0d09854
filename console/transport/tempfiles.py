"""Temp names for atomic writes, shaped so a later push can tell its own stale ones apart.

Every file the console writes on a host goes first to a temp name beside its target, then is
renamed over it. A killed connection or a killed console leaves that temp behind (a partial
upload: possibly hundreds of MB). The name says who wrote it:

    .<name>.tmp-e3-<machine>-<pid>-<start>-<random>

`machine` is a hash of this workstation's identity, `pid` and `start` (whole seconds since the
epoch) the writing console process. A temp is stale when it was written on this machine by a
process that is gone (the PID is free, or now belongs to a process started at another time).
Temps written from another machine, and any other name (including the `.<name>.tmp-XXXXXXXX`
of older versions, and a user's look-alikes), are never judged stale: we cannot prove they are
ours and abandoned.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket

import psutil

_SHAPE = re.compile(r"\A\.(?P<target>.+)\.tmp-e3-(?P<machine>[0-9a-f]{8})-(?P<pid>[0-9]{1,10})"
                    r"-(?P<start>[0-9]{1,12})-[0-9a-f]{8}\Z", re.DOTALL)
#: a process whose start time differs from the recorded one by more is another process
_START_SLACK = 2


def _machine_tag() -> str:
    ident = socket.gethostname()
    for p in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            with open(p, encoding="ascii") as f:
                ident += "/" + f.read().strip()
            break
        except (OSError, UnicodeDecodeError):
            continue
    return hashlib.sha256(ident.encode("utf-8", "replace")).hexdigest()[:8]


def _start_time(pid: int) -> int | None:
    try:
        return int(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


MACHINE = _machine_tag()
_owner: tuple[int, str] | None = None


def owner() -> str:
    """This process as temp names record it (recomputed after a fork)."""
    global _owner
    pid = os.getpid()
    if _owner is None or _owner[0] != pid:
        _owner = (pid, f"e3-{MACHINE}-{pid}-{_start_time(pid) or 0}")
    return _owner[1]


def temp_name(target: str) -> str:
    """`.<name>.tmp-e3-...` beside target (same filesystem, so the rename is atomic)."""
    head, tail = os.path.split(target)
    return os.path.join(head, f".{tail}.tmp-{owner()}-{secrets.token_hex(4)}")


def is_ours(name: str) -> bool:
    """Whether a file name (no folder) has the shape of a temp this console writes."""
    return _SHAPE.match(name) is not None


def is_own_process(name: str) -> bool:
    """Whether the temp was written by this very process."""
    m = _SHAPE.match(name)
    return m is not None and f"e3-{m['machine']}-{m['pid']}-{m['start']}" == owner()


def is_stale(name: str) -> bool:
    """True only for a temp of our shape, written on this machine by a process that is gone
    (not this process: callers decide about their own, see console/hosts/push.py)."""
    m = _SHAPE.match(name)
    if m is None or m["machine"] != MACHINE or is_own_process(name):
        return False
    started = _start_time(int(m["pid"]))
    return started is None or abs(started - int(m["start"])) > _START_SLACK
