"""Asking the host-side runner for time before it kills the run, and telling it what was left.

`stop` sends SIGTERM, then SIGKILL after a grace of seconds. Some cleanup takes longer than any
grace and must not be cut: a drafter swapped back into a production server (train
--eval-server) reads the whole drafter. While it runs, the engine writes HOLD in the run
directory the runner names in EAGLE3_RUN_DIR (console/hostside/runner.py); the runner waits
until `until`, or `after_term_s` past its SIGTERM (at most its own cap) before SIGKILL: the
second kind is written ahead, while a stop would need the cleanup (a checkpoint is in the
server), since a slow step can keep the engine from writing anything within the grace. `left`
is what stays undone if the hold is cut, or, written after a cleanup that failed, what the
user must do: `stop` prints it. Without EAGLE3_RUN_DIR (a run started by hand) nothing is
written. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

ENV = "EAGLE3_RUN_DIR"
HOLD = "stop-hold.json"


def _path() -> str | None:
    run_dir = os.environ.get(ENV)
    return os.path.join(run_dir, HOLD) if run_dir and os.path.isdir(run_dir) else None


def _write(doc: dict[str, object]) -> None:
    path = _path()
    if path is None:
        return
    tmp = f"{path}.tmp-{os.getpid()}"
    # a hold that cannot be written only loses the wait: the cleanup itself goes on
    with contextlib.suppress(OSError):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, path)


def hold(seconds: float, why: str, left: str, *, from_stop: bool = False) -> None:
    """Ask for `seconds` more before SIGKILL, counted from now or (from_stop) from a stop's
    SIGTERM whenever it comes: `why` (the cleanup), `left` (what stays undone if it is cut)."""
    _write({"until": 0 if from_stop else time.time() + seconds,
            "after_term_s": seconds if from_stop else 0, "why": why, "left": left})


def leave(left: str) -> None:
    """No more waiting; `left` says what the user must do (the cleanup failed)."""
    _write({"until": 0, "after_term_s": 0, "why": "", "left": left})


def release() -> None:
    """The cleanup is done: nothing to wait for, nothing left."""
    path = _path()
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)
