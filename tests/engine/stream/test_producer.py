"""The producer against a real Mooncake master on 127.0.0.1: a put over the unfinished put of
a producer killed mid-put is tried again until it is kept (any other put is made once); a
producer started again keeps what the store holds and skips what the trainer has done; a
producer resuming from a pause looks at the trainer's plan before it puts more."""

from __future__ import annotations

import io
import subprocess
import sys
import threading

import pytest
import torch

from engine.data.features import Sample
from engine.events import Emitter
from engine.stream import codec, keys
from engine.stream import manifest as mf
from engine.stream import plan_order as po
from engine.stream import progress as pg
from engine.stream.master import Master
from engine.stream.pool import Watermarks
from engine.stream.producer import Produced, Producer
from engine.stream.store import NOT_FOUND, NOT_READY, StoreClient
from tests.engine_helpers import REPO, engine_env
from tests.stream_store import Tiny, tiny
from tests.waiting import wait_until

pytest_plugins = ("tests.stream_store",)
pytestmark = pytest.mark.usefixtures("mooncake")

T, H = 1000, 9000  # a 144 MB sample: its put takes long enough to be killed in the middle
KEY = "swallow/s/0.0"

_PUT_KILLED = r"""
import sys
from engine.stream.address import StreamAddress
from engine.stream.store import StoreClient
c = StoreClient(StreamAddress.parse(sys.argv[1]))
n = int(sys.argv[3])
c.buffer.ensure(n)
print("putting", flush=True)
c.put_from(sys.argv[2], n)
print("put", flush=True)
"""


def test_a_put_over_a_killed_producers_unfinished_put_is_kept(stream_master: Master) -> None:
    """Mooncake answers a put of a key whose earlier put never finished with success and keeps
    nothing, until the master discards the earlier one: the producer puts again until the
    sample is there."""
    spec = codec.SampleSpec(T, H, "float32", False)
    n = codec.encoded_size(spec)
    g = torch.Generator().manual_seed(0)  # made first: the put must come before the discard
    s = Sample(torch.randint(0, 1000, (T,), generator=g), torch.ones(T, dtype=torch.long),
               torch.randn(T, 3 * H, generator=g), torch.randn(T, H, generator=g), None)
    client = StoreClient(stream_master.address)
    out = io.StringIO()
    ev = Emitter("stream", json_mode=True, out=out, err=io.StringIO())
    p = Producer(client, "swallow", Watermarks(4, 1, 1 << 30, 1 << 29), ev)
    p.client.buffer.ensure(n)
    child = subprocess.Popen([sys.executable, "-c", _PUT_KILLED, str(stream_master.address), KEY,
                              str(n)], cwd=REPO, env=engine_env(), stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout is not None
    assert child.stdout.readline() == "putting\n"
    try:  # killed once the master has the put under way
        wait_until(lambda: client.store.get_size(KEY) != NOT_FOUND, 30, "the child's put")
        child.kill()
        child.wait()
        assert client.store.get_size(KEY) == NOT_READY, "the put finished: make it larger"
        p.put(KEY, s, spec, 0)
        back = codec.decode(client.get_into(KEY), spec, KEY)
        assert torch.equal(back.hidden, s.hidden) and torch.equal(back.aux, s.aux)
        assert "held by an unfinished put" in out.getvalue()
        client.remove([KEY, "swallow/beat"])
    finally:
        child.kill()
        child.wait()
        client.close()


def test_a_producer_started_again_keeps_what_is_there_and_skips_what_was_trained(
        stream_master: Master) -> None:
    """A plan of four steps of two samples (one held out); the first producer put it all and
    is gone (its objects stay in the holder); the trainer did step 1 of it (progress 1) and
    removed step 0's first sample and step 2's last, not yet the other of step 0. The producer
    started again removes what is left of step 0, keeps the rest, puts only step 2's missing
    sample, and ends with the run's small keys removed once the trainer has taken everything."""
    run = "again"
    client = StoreClient(stream_master.address)
    out = io.StringIO()
    ev = Emitter("stream", json_mode=True, out=out, err=io.StringIO())
    manifest = mf.build(Tiny(), "float32", {})
    plan = po.PlanOrder(0, "n1", (7,), ((0, (0, 1)), (0, (2, 3)), (0, (4, 5)), (1, (6, 0))))
    try:
        first = Producer(client, run, Watermarks(16, 8, 1 << 20, 1 << 19), ev)
        first.publish(manifest)
        client.put_bytes(keys.plan_key(run), po.encode(plan))
        put_all = [(keys.held_key(run, 7), 7, None)] + [
            (keys.sample_key(run, e, i), i, s) for s, (e, idx) in enumerate(plan.steps)
            for i in idx]
        for key, i, step in put_all:
            first.put(key, tiny(i), manifest.spec(i), step)
        client.remove([keys.sample_key(run, 0, 0), keys.sample_key(run, 0, 5)])
        client.put_bytes(keys.ack_key(run), pg.encode(pg.Progress("n1", 1)))

        made: list[int] = []

        def sample_of(i: int) -> Sample:
            made.append(i)
            return tiny(i)

        again = Producer(client, run, Watermarks(16, 8, 1 << 20, 1 << 19), ev)
        again.publish(manifest)
        assert again.wait_plan(5) == plan
        trainer = threading.Thread(target=_take_all, args=(client, run, plan), daemon=True)
        trainer.start()
        got = again.produce(sample_of, plan)
        trainer.join(10)
        assert made == [5]  # only the missing sample of a step still to come
        text = out.getvalue()
        assert "6 samples of the plan already in the store (kept); 1 the trainer is done " \
               "with removed" in text
        assert "the trainer has done 1 steps of its plan; producing from its step 1" in text
        assert got.samples == 7
        left = [keys.manifest_key(run), keys.plan_key(run), keys.ack_key(run),
                keys.beat_key(run), keys.sample_key(run, 0, 1)]
        assert client.exists(left) == [False, True, False, False, False]
    finally:
        client.remove([keys.plan_key(run)])
        client.close()


def _take_all(client: StoreClient, run: str, plan: po.PlanOrder) -> None:
    """The trainer's removals once everything of steps 1-3 and the held-out sample is there."""
    want = [keys.held_key(run, 7)] + [keys.sample_key(run, e, i)
                                      for e, idx in plan.steps[1:] for i in idx]
    wait_until(lambda: all(client.exists(want)), 10, "the samples to come")
    client.remove(want)


def test_a_producer_started_again_after_the_run_ended_cleans_up_and_exits(
        stream_master: Master) -> None:
    """The trainer finished while the producer was down (progress marked done, no plan): the
    producer started again does not wait for a plan that will never come."""
    run = "ended"
    client = StoreClient(stream_master.address)
    try:
        client.put_bytes(keys.ack_key(run), pg.encode(pg.Progress("n1", 6, done=True)))
        p = Producer(client, run, Watermarks(16, 8, 1 << 20, 1 << 19),
                     Emitter("stream", json_mode=True, out=io.StringIO(), err=io.StringIO()))
        p.publish(mf.build(Tiny(), "float32", {}))
        got = p.produce(tiny, p.wait_plan(5))
        assert got.samples == 0
        assert client.exists([keys.manifest_key(run), keys.ack_key(run),
                              keys.beat_key(run)]) == [False, False, False]
    finally:
        client.close()


_TAKE_AT_ONCE = r"""
import sys
from engine.stream.address import StreamAddress
from engine.stream.store import StoreClient
c = StoreClient(StreamAddress.parse(sys.argv[1]))
print("ready", flush=True)
for key in sys.argv[2:]:
    while c.size(key) is None:
        pass
    c.get_into(key)
    c.remove([key])
print("taken", flush=True)
"""


def test_a_sample_the_trainer_takes_at_once_is_put_once(stream_master: Master) -> None:
    """A trainer that takes and removes each sample the moment it is there (another process
    polling the store): the producer ends, no put is taken for a killed producer's, nothing is
    left. (A producer that looked for each sample after its put could find it gone and put it
    again, a copy nobody takes; that race needs a busy machine and is not forced here.)"""
    run = "quick"
    client = StoreClient(stream_master.address)
    out = io.StringIO()
    ev = Emitter("stream", json_mode=True, out=out, err=io.StringIO())
    plan = po.PlanOrder(0, "n1", (), tuple((e, (i,)) for e in range(8) for i in range(8)))
    want = [keys.sample_key(run, e, idx[0]) for e, idx in plan.steps]
    child = subprocess.Popen([sys.executable, "-c", _TAKE_AT_ONCE, str(stream_master.address),
                              *want], cwd=REPO, env=engine_env(), stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout is not None
    try:
        assert child.stdout.readline() == "ready\n"
        p = Producer(client, run, Watermarks(64, 32, 1 << 20, 1 << 19), ev)
        p.publish(mf.build(Tiny(), "float32", {}))
        done: list[object] = []
        prod = threading.Thread(target=lambda: done.append(p.produce(tiny, plan)), daemon=True)
        prod.start()
        prod.join(30)
        assert done, "the producer still waits for a sample it put twice to be taken"
        assert child.stdout.readline() == "taken\n"
        assert "unfinished put" not in out.getvalue()
        assert not any(client.exists(want))
    finally:
        child.kill()
        child.wait()
        client.close()


def test_a_producer_resuming_from_a_pause_looks_at_the_plan_first(
        stream_master: Master) -> None:
    """A trainer started again puts its plan and takes samples between two of the producer's
    timed looks (a fast trainer: steps of milliseconds): the producer, resuming from its pause,
    looks at the plan before it puts anything more, and produces the new one."""
    run = "replan"
    client = StoreClient(stream_master.address)
    out = io.StringIO()
    ev = Emitter("stream", json_mode=True, out=out, err=io.StringIO())
    old = po.PlanOrder(0, "n1", (), ((0, (0, 1)), (0, (2, 3)), (0, (4, 5)), (0, (6, 7))))
    new = po.PlanOrder(1, "n2", (), old.steps[1:])
    try:
        p = Producer(client, run, Watermarks(4, 2, 1 << 20, 1 << 19), ev, look_s=3600)
        p.publish(mf.build(Tiny(), "float32", {}))
        done: list[Produced] = []
        prod = threading.Thread(target=lambda: done.append(p.produce(tiny, old)), daemon=True)
        prod.start()
        wait_until(lambda: "stream producer paused" in out.getvalue(), 30, "a pause")
        client.put_bytes(keys.plan_key(run), po.encode(new))
        client.remove([keys.sample_key(run, 0, i) for i in (0, 1)])  # the old trainer's step
        wait_until(lambda: "the trainer asks again from its step 1; producing its new plan"
                   in out.getvalue(), 10, "the producer's new plan")
        for _, idx in new.steps:
            for i in idx:
                key = keys.sample_key(run, 0, i)
                wait_until(lambda k=key: client.exists([k])[0], 30, key)
                client.remove([key])
        prod.join(30)
        assert done and done[0].samples == 6
    finally:
        client.remove([keys.plan_key(run)])
        client.close()
