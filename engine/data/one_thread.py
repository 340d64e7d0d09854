"""Torch's intra-op parallelism off for the calling OS thread only.

The threads that move features (encode and put, check and norm, decode, write shards) run
beside a model forward: vLLM's engine core or the trainer's step, whose OpenMP team has the
cores. Their copies and small ops, split over a team of their own, wake threads that fight
that team for the same cores, and both slow down: on 2 busy cores a sample's encode took 10x
longer with 2 threads than with 1 (docs/benchmarks.md, the producer's row). One thread each
keeps them out of the forward's way; their work is memory copies that one core does at memory
speed.

OpenMP's thread count is a setting of each OS thread, but torch.set_num_threads also stores
the count process-wide, and every thread takes that stored count on its first parallel op: a
helper thread calling it would leave the next new thread (or a main thread that has not run a
parallel op yet) with one thread too. So the count is set through OpenMP itself, after torch
has given this thread its own; torch's stored count is left alone.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Iterator

import torch

#: OpenMP's own setter in this process (torch's libgomp or libiomp5); None if none is loaded
_SET: Callable[[int], int] | None = getattr(ctypes.CDLL(None), "omp_set_num_threads", None)


def _set(n: int) -> None:
    torch.get_num_threads()  # torch's first-use setting of this thread, before ours
    if _SET is not None:
        _SET(n)


def one_thread() -> None:
    """This thread's torch ops on this thread alone (a pool's initializer, a thread's first
    line)."""
    _set(1)


@contextlib.contextmanager
def one_thread_here() -> Iterator[None]:
    """This thread's torch ops on this thread alone for the block; its count restored after."""
    n = torch.get_num_threads()
    _set(1)
    try:
        yield
    finally:
        _set(n)
