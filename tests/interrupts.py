"""Ctrl-C at every point: run a call once for each bytecode of the functions named, raising
KeyboardInterrupt just before that bytecode, the way a signal handler can fire between any two.
A cleanup that closes what another object already owns shows up as an OSError (EBADF) instead
of the KeyboardInterrupt."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from types import CodeType, FrameType
from typing import Any


class _Done(Exception):
    pass


def _run_interrupted_at(call: Callable[[], Any], codes: frozenset[CodeType], k: int) -> bool:
    """Run `call` with a KeyboardInterrupt raised before the k-th traced bytecode. True when the
    call had fewer than k bytecodes (ran to the end); a KeyboardInterrupt passes through; any
    other exception is the defect and passes through too."""
    seen = 0

    def local(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal seen
        if event == "opcode":
            seen += 1
            if seen == k:
                raise KeyboardInterrupt
        return local

    def enter(frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code in codes:
            frame.f_trace_opcodes = True
            return local
        return None

    sys.settrace(enter)
    try:
        call()
    finally:
        sys.settrace(None)
    return seen < k


def interrupt_everywhere(call: Callable[[], Any], functions: Iterable[Callable[..., Any]],
                         limit: int = 2000) -> int:
    """Interrupt `call` at each bytecode of `functions` in turn; every run must either end with
    KeyboardInterrupt or complete. Returns how many points were tried."""
    codes = frozenset(f.__code__ for f in functions)
    for k in range(1, limit):
        try:
            if _run_interrupted_at(call, codes, k):
                return k - 1
        except KeyboardInterrupt:
            continue
    raise AssertionError(f"more than {limit} bytecodes: not a bounded call")
