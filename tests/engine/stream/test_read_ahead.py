"""The trainer's read-ahead (engine/stream/read_ahead.py) through StreamData, against a real
Mooncake master on 127.0.0.1: the next micro-batches are read while the caller is busy, the ack
removes only what the step used, and what goes wrong in the thread (a producer that never puts
a sample, a sample that is not one) is the training loop's one-line error."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator

import pytest
import torch

from engine.data.features import Sample
from engine.errors import EngineError
from engine.stream import keys
from engine.stream.master import Master
from engine.stream.store import StoreClient
from engine.stream.stream_data import StreamData
from engine.training.plan import Step
from tests.stream_store import open_tiny, put_tiny, tiny
from tests.waiting import wait_until

pytest_plugins = ("tests.stream_store",)
pytestmark = pytest.mark.usefixtures("mooncake")


@pytest.fixture
def producer(stream_master: Master) -> Iterator[StoreClient]:
    c = StoreClient(stream_master.address)
    yield c
    c.close()


def _same(a: Sample, b: Sample) -> bool:
    return torch.equal(a.aux, b.aux) and torch.equal(a.hidden, b.hidden) \
        and torch.equal(a.input_ids, b.input_ids)


def _plan(data: StreamData, *micro: tuple[int, ...]) -> None:
    steps = [Step(0, s, (m,)) for s, m in enumerate(micro)]
    data.plan_steps(steps, [], 0, 0, 1)


def test_the_next_micro_batches_are_read_while_the_caller_is_busy(
        producer: StoreClient) -> None:
    """Three one-micro-batch steps, all put. Once the caller has the first, the next two are
    read without being asked for: their samples are the caller's even after the store lost
    them, the caller is not counted as reading, and the ack of step 1 removes step 1's samples
    only."""
    run = "ahead"
    data = open_tiny(producer, run, io.StringIO())
    try:
        for i in range(6):
            put_tiny(producer, data, run, i)
        _plan(data, (0, 1), (2, 3), (4, 5))
        first = data._samples((0, 1))
        assert all(_same(s, tiny(i)) for s, i in zip(first, (0, 1), strict=True))
        ahead = data.ahead
        assert ahead is not None
        wait_until(lambda: len(ahead.ready_at) == 3, 10, "the next two micro-batches read")
        read_s = data.read_s
        data.ack(1)
        sample = [keys.sample_key(run, 0, i) for i in range(6)]
        assert producer.exists(sample) == [False, False, True, True, True, True]
        producer.remove(sample[2:4])  # read ahead already: the store no longer needed
        second = data._samples((2, 3))
        assert all(_same(s, tiny(i)) for s, i in zip(second, (2, 3), strict=True))
        assert data.read_s == read_s and data.waits == 0
        data.ack(2)
        data.batch((4, 5))
        data.ack(3)
        assert producer.exists(sample) == [False] * 6
    finally:
        data.close()
        producer.remove([keys.manifest_key(run), keys.plan_key(run), keys.ack_key(run)])
    assert not ahead._thread.is_alive()


def test_a_sample_the_producer_never_puts_gives_up_in_the_training_loop(
        producer: StoreClient) -> None:
    """The thread waits for a sample that never comes and no heartbeat beats: the caller says it
    waits, counts the wait as waiting, and gives up after --producer-timeout with one line."""
    run = "never"
    out = io.StringIO()
    data = open_tiny(producer, run, out, say_s=0.2, silent_say_s=0.5, give_up_s=1.5)
    try:
        put_tiny(producer, data, run, 0)
        _plan(data, (0,), (1,))
        data.batch((0,))
        data.ack(1)
        t0 = time.monotonic()
        with pytest.raises(EngineError) as e:
            data.batch((1,))
        msg = str(e.value)
        assert "\n" not in msg
        assert (f"the producer has been silent for 2 s while the trainer waits for "
                f"{keys.sample_key(run, 0, 1)} (--producer-timeout 1.5)") in msg
        assert time.monotonic() - t0 < 10
        said = [json.loads(line).get("msg", "") for line in out.getvalue().splitlines()]
        assert f"stream trainer: waiting for sample {keys.sample_key(run, 0, 1)} (the " \
               "producer lags)" in said
        assert any("producer silent for" in s for s in said)
    finally:
        data.close()
        producer.remove([keys.manifest_key(run), keys.plan_key(run), keys.ack_key(run)])


def test_a_sample_that_is_not_one_is_the_training_loops_one_line_error(
        producer: StoreClient) -> None:
    """The thread's decode fails on the second micro-batch: the first is still handed over, and
    asking for the second raises the decode's own line."""
    run = "garbled"
    data = open_tiny(producer, run, io.StringIO())
    key = keys.sample_key(run, 0, 1)
    try:
        put_tiny(producer, data, run, 0)
        producer.put_bytes(key, b"not a sample at all")
        _plan(data, (0,), (1,))
        assert _same(data[0], tiny(0))
        with pytest.raises(EngineError, match=rf"^stream object {key}: not a sample of ours"):
            data.batch((1,))
    finally:
        data.close()
        producer.remove([keys.manifest_key(run), keys.plan_key(run), keys.ack_key(run),
                         keys.sample_key(run, 0, 0), key])
