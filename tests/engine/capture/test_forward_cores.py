"""The capture's threads leave the cores vLLM's forward is bound to, and come back."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest
import torch

from engine.capture.forward_cores import OffForwardCores, describe

ALL = os.sched_getaffinity(0)


def thread_cpus() -> dict[int, set[int]]:
    return {int(t): os.sched_getaffinity(int(t)) for t in os.listdir("/proc/self/task")}


@pytest.fixture
def restored() -> Iterator[None]:
    n = torch.get_num_threads()
    try:
        yield
    finally:
        for t in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(t), ALL)
            except OSError:
                pass
        torch.set_num_threads(n)


@pytest.mark.skipif(len(ALL) < 2, reason="needs two cores to leave one to the forward")
@pytest.mark.usefixtures("restored")
def test_threads_before_and_after_leave_the_forwards_cores_and_come_back() -> None:
    forward = {min(ALL)}
    stop = threading.Event()
    early = threading.Thread(target=stop.wait, daemon=True)
    early.start()
    cores = OffForwardCores([forward])
    try:
        assert cores.moved_to == ALL - forward
        seen: list[set[int]] = []
        late = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
        late.start()
        late.join()
        assert seen == [ALL - forward]  # a thread started later inherits the move
        assert set(map(frozenset, thread_cpus().values())) == {frozenset(ALL - forward)}
        assert torch.get_num_threads() <= len(ALL - forward)
    finally:
        cores.release()
    assert all(c == ALL for c in thread_cpus().values())
    stop.set()


@pytest.mark.usefixtures("restored")
@pytest.mark.parametrize("workers", [[None], [sorted(ALL)], [[]], [[min(ALL)], None]])
def test_unbound_workers_move_nothing(workers: list[list[int] | None]) -> None:
    """A worker that may run anywhere (a GPU host's), or said nothing: nothing moves."""
    before = thread_cpus()
    cores = OffForwardCores(workers)
    assert cores.moved_to == set()
    assert thread_cpus() == before
    cores.release()


def test_cores_are_said_as_ranges() -> None:
    assert describe({1}) == "1"
    assert describe({2, 3, 4, 5, 7}) == "2-5,7"
    assert describe({0, 2}) == "0,2"
