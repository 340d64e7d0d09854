"""engine/data/one_thread.py: a feature thread drops to one OpenMP thread without taking the
forward's team away, now or from a thread that starts later."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from engine.data.one_thread import one_thread, one_thread_here


def in_thread(fn: Callable[[], None] | None) -> list[int]:
    """The torch thread count a new thread sees after `fn` (None: straight away)."""
    seen: list[int] = []

    def run() -> None:
        if fn is not None:
            fn()
        seen.append(torch.get_num_threads())

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return seen


def test_one_thread_in_a_thread_leaves_every_other_thread_its_count() -> None:
    torch.set_num_threads(2)
    assert in_thread(one_thread) == [1]
    assert torch.get_num_threads() == 2
    assert in_thread(None) == [2]   # a thread started after it still gets the process's count


def test_one_thread_here_restores_the_count_after_the_block() -> None:
    torch.set_num_threads(2)
    with one_thread_here():
        assert torch.get_num_threads() == 1
        assert in_thread(None) == [2]
    assert torch.get_num_threads() == 2

