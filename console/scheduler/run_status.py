"""A run's status: the one enum the console compares, and its ended and active sets.

The host-side runner writes these words into run.json (console/hostside/records.py keeps the
same list for Python 3.8 hosts); `corrupt` is the console's own word for a record it cannot
trust. Everything on the console side compares RunStatus members, never the strings.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence


class RunStatus(str, enum.Enum):
    """What a run record says about its run (a str: JSON output and f-strings show the word)."""

    PENDING = "pending"       # a Slurm job waiting for its nodes
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"             # its processes are gone without a recorded end, or not ours
    CORRUPT = "corrupt"       # the record cannot be trusted: nothing in it is acted on

    def __str__(self) -> str:
        return self.value

    @property
    def active(self) -> bool:
        """Still running or queued: a stop has something to signal or cancel."""
        return self in ACTIVE

    @property
    def ended(self) -> bool:
        """Over with a known outcome: what `prune` may forget."""
        return self in ENDED

    @classmethod
    def parse(cls, value: object) -> RunStatus | None:
        """The status a record names, or None for anything else."""
        try:
            return cls(value)
        except ValueError:
            return None


#: running or waiting for nodes
ACTIVE = frozenset({RunStatus.PENDING, RunStatus.RUNNING})
#: over, with an outcome the host recorded (a corrupt record is neither active nor ended)
ENDED = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.STOPPED, RunStatus.LOST})
#: what `follow` (and `launch`, for a run that ended at once) exits with, by the run's outcome;
#: the "Exit codes" table of docs/subcommands.md (1 is also any error the console prints as
#: `error: ...`)
EXIT_CODES = {RunStatus.SUCCEEDED: 0, RunStatus.FAILED: 1, RunStatus.STOPPED: 3,
              RunStatus.LOST: 4, RunStatus.CORRUPT: 5}
#: a multi-node run's status is the first of these any node has (then succeeded)
_PRECEDENCE = (RunStatus.RUNNING, RunStatus.PENDING, RunStatus.CORRUPT, RunStatus.LOST,
               RunStatus.STOPPED, RunStatus.FAILED)


def combined_status(statuses: Sequence[RunStatus]) -> RunStatus:
    """One status for a multi-node run: running while any node runs, then the worst outcome."""
    for s in _PRECEDENCE:
        if s in statuses:
            return s
    return RunStatus.SUCCEEDED if statuses else RunStatus.LOST
