"""The store's key scheme for one stream run `RUN` (a name both sides are given):

    RUN/manifest         the run's manifest (engine/stream/manifest.py), put once by the producer
    RUN/plan             the sample order the trainer asks for (engine/stream/plan_order.py)
    RUN/s/EPOCH.INDEX    sample INDEX as trained in epoch EPOCH (one object, engine/stream/codec.py)
    RUN/h/INDEX          a held-out sample (read by every estimate, removed at the end)
    RUN/ack              the trainer's progress: the last step done under its plan's nonce
                         (engine/stream/progress.py), so a restarted producer skips what was
                         trained
    RUN/beat             the producer's heartbeat, a counter it raises every second or so
    RUN/wait/RANK        a trainer rank other than 0 waiting long for a sample, for rank 0 to
                         say (engine/stream/peer_waits.py); gone when the wait ends
"""

from __future__ import annotations

import re

from engine.errors import EngineError

_RUN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


def check_run(name: str, what: str = "--stream-run") -> str:
    if not _RUN.match(name):
        raise EngineError(f"{what} {name!r}: 1-64 letters, digits, '_', '.', '-' (starting with "
                          "a letter or digit)")
    return name


def manifest_key(run: str) -> str:
    return f"{run}/manifest"


def plan_key(run: str) -> str:
    return f"{run}/plan"


def sample_key(run: str, epoch: int, index: int) -> str:
    return f"{run}/s/{epoch}.{index}"


def held_key(run: str, index: int) -> str:
    return f"{run}/h/{index}"


def ack_key(run: str) -> str:
    return f"{run}/ack"


def beat_key(run: str) -> str:
    return f"{run}/beat"


def wait_key(run: str, rank: int) -> str:
    return f"{run}/wait/{rank}"
