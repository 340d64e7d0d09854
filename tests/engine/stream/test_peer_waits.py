"""Another rank's wait for the producer, said by rank 0 (engine/stream/peer_waits.py): two
StreamData of one run as rank 0 and rank 1 of a 3-rank trainer, against a real Mooncake master
on 127.0.0.1. Rank 0 has its sample and is busy; rank 1 waits on a producer that does not beat."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator

import pytest

from engine.errors import EngineError
from engine.stream import keys
from engine.stream.master import Master
from engine.stream.peer_waits import WaitRecord, encode
from engine.stream.store import StoreClient
from engine.stream.stream_data import StreamData
from engine.training.plan import Step
from tests.stream_store import open_tiny, put_tiny
from tests.waiting import wait_until

pytest_plugins = ("tests.stream_store",)
pytestmark = pytest.mark.usefixtures("mooncake")

#: one step of three one-sample micro-batches: rank r trains on sample r
STEP = [Step(0, 0, ((0,), (1,), (2,)))]


@pytest.fixture
def producer(stream_master: Master) -> Iterator[StoreClient]:
    c = StoreClient(stream_master.address)
    yield c
    c.close()


def said(out: io.StringIO) -> list[tuple[str, str]]:
    """(level, message) of every log line reported so far."""
    evs = [json.loads(line) for line in out.getvalue().splitlines()]
    return [(e["level"], e["msg"]) for e in evs if e["kind"] == "log"]


def ranks(producer: StoreClient, run: str, **kw: float) -> tuple[StreamData, io.StringIO,
                                                                    StreamData]:
    out0 = io.StringIO()
    d0 = open_tiny(producer, run, out0, say_s=0.2, silent_say_s=1.0)
    d1 = open_tiny(producer, run, io.StringIO(), say_s=0.2, silent_say_s=1.0, **kw)
    return d0, out0, d1


def test_a_rank_waiting_on_a_silent_producer_is_said_by_rank_0_while_it_is_busy(
        producer: StoreClient) -> None:
    """Rank 0 has its sample; rank 1 waits for its own and no heartbeat beats. Rank 0 says the
    wait and the silence rank 1 measures, and the wait's end, and its step's metric holds that
    silence. A record a killed rank 1 left is gone once rank 0 puts its plan; one a killed
    rank 2 leaves afterwards (its counter never moves) is never said and goes at the end."""
    run = "peers"
    d0, out0, d1 = ranks(producer, run)
    got: list[object] = []
    stale = encode(WaitRecord(keys.sample_key(run, 0, 2), 9.0, 9.0, 7))
    try:
        producer.put_bytes(keys.wait_key(run, 1), stale)
        put_tiny(producer, d0, run, 0)
        d0.plan_steps(STEP, [], 0, 0, 3)
        assert producer.exists([keys.wait_key(run, 1)]) == [False]
        producer.put_bytes(keys.wait_key(run, 2), stale)
        d1.plan_steps(STEP, [], 0, 1, 3)
        assert d0.batch((0,))["input_ids"].shape[0] == 1  # rank 0 has its step's sample
        t = threading.Thread(target=lambda: got.append(d1.batch((1,))), daemon=True)
        t.start()
        want = keys.sample_key(run, 0, 1)
        wait_until(lambda: ("info", f"stream trainer: rank 1 waiting for sample {want} (the "
                            "producer lags)") in said(out0), 20, "rank 0 saying rank 1's wait")
        wait_until(lambda: any(m.startswith("stream trainer: producer silent for ") and
                               f"(rank 1 waiting for {want})" in m for _, m in said(out0)),
                   20, "rank 0 saying the producer's silence rank 1 measured")
        assert got == [] and t.is_alive()
        put_tiny(producer, d0, run, 1)
        t.join(20)
        assert len(got) == 1
        wait_until(lambda: any(m.startswith("stream trainer: rank 1 waited ") and
                               m.endswith(f" s for {want}") for _, m in said(out0)),
                   20, "rank 0 saying the wait's end")
        assert producer.exists([keys.wait_key(run, 1)]) == [False]
        assert not any("rank 2" in m for _, m in said(out0))
        d0.ack(1)
        metric = [json.loads(x) for x in out0.getvalue().splitlines()][-1]
        assert metric["kind"] == "metric" and metric["values"]["producer_silent_s"] >= 1.0
        d0.finish()
        assert producer.exists([keys.wait_key(run, 2)]) == [False]
    finally:
        d0.close()
        d1.close()
        producer.remove([keys.manifest_key(run), keys.plan_key(run), keys.ack_key(run),
                         keys.wait_key(run, 1), keys.wait_key(run, 2),
                         *(keys.sample_key(run, 0, i) for i in range(3))])


def test_a_rank_giving_up_on_the_producer_is_said_by_rank_0(producer: StoreClient) -> None:
    """Rank 1 gives up after --producer-timeout: its one-line error is also rank 0's, as an
    error, while rank 0 would otherwise sit in the step until torchrun ends it."""
    run = "peers-give-up"
    d0, out0, d1 = ranks(producer, run, give_up_s=2.0)
    try:
        put_tiny(producer, d0, run, 0)
        d0.plan_steps(STEP, [], 0, 0, 3)
        d1.plan_steps(STEP, [], 0, 1, 3)
        d0.batch((0,))
        with pytest.raises(EngineError, match=r"\(--producer-timeout 2\)") as e:
            d1.batch((1,))
        wait_until(lambda: ("error", f"stream trainer: rank 1: {e.value}") in said(out0), 20,
                   "rank 0 saying rank 1's give-up")
    finally:
        d0.close()
        d1.close()
        producer.remove([keys.manifest_key(run), keys.plan_key(run), keys.ack_key(run),
                         keys.wait_key(run, 1), keys.sample_key(run, 0, 0)])
