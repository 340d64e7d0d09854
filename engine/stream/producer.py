"""The producer's side of a stream run: publish the manifest, wait for the trainer's plan, and
put each sample in the plan's order, paced by the in-flight pool (engine/stream/pool.py).

`produce(data, ...)` does it for any FeatureData (a prepared data directory today; a capture
hands its samples over the same way). The store's memory is lent by a holder beside the master
(engine/stream/holder.py), so what the producer put outlives it. Killed and started again with
the same command, a producer reads the plan and the trainer's progress (engine/stream/
progress.py), keeps what is already in the store, skips the steps already trained on and puts
the rest. It raises a heartbeat (RUN/beat) about every `beat_s` while it runs, so a waiting
trainer can tell a slow producer from a dead one. It stays until the trainer has taken every
sample (`drain`), then removes the run's manifest, heartbeat and progress.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from engine.data.features import FeatureData, Sample
from engine.data.one_thread import one_thread_here
from engine.errors import EngineError
from engine.events import Emitter
from engine.stream import codec, keys
from engine.stream import manifest as mf
from engine.stream import plan_order as po
from engine.stream import progress as pg
from engine.stream.pool import InFlight, Watermarks
from engine.stream.store import StoreClient

#: the metric event's name for the producer's pool figures
PRODUCER = "stream producer"
#: a put that keeps nothing (a killed producer's unfinished put of the key is still there) is
#: tried again until the master discards that put (engine/stream/master.py), this long at most
SWALLOWED_PUT_S = 600.0
_EXISTS_BATCH = 4096


@dataclass
class Produced:
    samples: int
    bytes: int
    put_s: float
    paused_s: float
    pauses: int
    peak: int


class Replan(Exception):
    """The trainer put a new plan (it was restarted): production starts over from it."""

    def __init__(self, plan: po.PlanOrder) -> None:
        super().__init__(plan.nonce)
        self.plan = plan


class Producer:
    def __init__(self, client: StoreClient, run: str, marks: Watermarks, ev: Emitter,
                 look_s: float = 0.25, beat_s: float = 1.0) -> None:
        self.client, self.run, self.ev = client, keys.check_run(run), ev
        self.pool = InFlight(marks, self._exists, ev, between=self._between,
                             remove=client.remove)
        self.plan: po.PlanOrder | None = None
        self.look_s, self._looked = look_s, time.monotonic()
        self.beat_s, self._beat_at, self._beats = beat_s, 0.0, 0
        self.put_s = 0.0
        self.total_bytes = 0
        self.tokens = 0  # tokens of the samples put (the producer's tokens/s in the console)

    def _exists(self, names: list[str]) -> list[bool]:
        out: list[bool] = []
        for i in range(0, len(names), _EXISTS_BATCH):
            out += self.client.exists(names[i:i + _EXISTS_BATCH])
        return out

    def beat(self) -> None:
        """Raise the heartbeat (at most every `beat_s`)."""
        now = time.monotonic()
        if now - self._beat_at >= self.beat_s:
            self._beat_at = now
            self._beats += 1
            self.client.put_bytes(keys.beat_key(self.run), f"{os.getpid()} {self._beats}".encode())

    def _between(self) -> None:
        self.beat()
        self._look()

    def progress(self) -> pg.Progress | None:
        """The trainer's progress as it last wrote it (None before its first step)."""
        key = keys.ack_key(self.run)
        raw = self.client.get_bytes(key)
        return pg.decode(raw, key) if raw is not None else None

    def publish(self, manifest: mf.StreamManifest) -> None:
        self.manifest = manifest
        self.client.put_bytes(keys.manifest_key(self.run), mf.encode(manifest))

    def wait_plan(self, timeout_s: float | None = None, poll_s: float = 0.05) -> po.PlanOrder:
        key = keys.plan_key(self.run)
        t0 = time.monotonic()
        said = False
        while True:
            self.beat()
            raw = self.client.get_bytes(key)
            if raw is not None:
                return po.decode(raw, key, len(self.manifest.lengths))
            done = self.progress()
            if done is not None and done.done:  # a producer restarted after the run ended
                self.ev.log(f"stream producer: the trainer of run {self.run} has finished")
                return po.PlanOrder(done.step, done.nonce, (), ())
            if not said:
                self.ev.log(f"stream producer: waiting for the trainer's plan ({key})")
                said = True
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                raise EngineError(f"stream run {self.run}: no trainer asked for samples within "
                                  f"{timeout_s:.0f} s")
            time.sleep(poll_s)

    def _look(self, now_s: bool = False) -> None:
        """Raise Replan when the trainer's plan is not the one being produced (looked at every
        `look_s` at most while waiting, and at once with `now_s`)."""
        now = time.monotonic()
        if self.plan is None or (not now_s and now - self._looked < self.look_s):
            return
        self._looked = now
        key = keys.plan_key(self.run)
        raw = self.client.get_bytes(key)
        if raw is not None:
            plan = po.decode(raw, key, len(self.manifest.lengths))
            if plan.nonce != self.plan.nonce:
                raise Replan(plan)
        self.pool.drop_before(pg.steps_done(self.progress(), self.plan))

    def put(self, key: str, sample: Sample, spec: codec.SampleSpec, step: int | None) -> None:
        """Put one sample of plan step `step` (None: held out), within the pool's marks."""
        n = codec.encoded_size(spec)
        pauses = self.pool.pauses
        self.pool.wait_room(n, key, step)
        if self.pool.pauses != pauses:
            # a trainer started again may have put its plan and taken samples within one look:
            # nothing more is put under the old plan
            self._look(now_s=True)
        t0 = time.perf_counter()
        size = codec.encode(sample, spec, self.client.buffer.ensure(n))
        self._put_kept(key, size)
        self.put_s += time.perf_counter() - t0
        self.pool.add(key, size, step)
        self.total_bytes += size
        self.tokens += spec.length

    def _put_kept(self, key: str, size: int) -> None:
        """Put the buffer's first `size` bytes under `key`. Mooncake answers a put of a key whose
        earlier put never finished (its producer killed mid-put: the key reads as not ready)
        with success and keeps nothing, until a put after the master's discard timeout: such a
        key is put until the sample is there. Any other key is put once and not looked at
        again: a trainer may take and remove it at once, and a second put would leave a copy
        no trainer takes."""
        if not self.client.pending(key):
            self.client.put_from(key, size)
            return
        t0, said = time.monotonic(), False
        while True:
            self.client.put_from(key, size)
            if self.client.size(key) is not None:
                break
            if time.monotonic() - t0 > SWALLOWED_PUT_S:
                raise EngineError(f"stream run {self.run}: {key}: the store keeps an unfinished "
                                  f"put of it for over {SWALLOWED_PUT_S:.0f} s (restart "
                                  "`engine stream-master`)")
            if not said:
                self.ev.log(f"stream producer: {key} is held by an unfinished put (a killed "
                            "producer's); putting it again once the store discards that")
                said = True
            time.sleep(0.2)
            self._between()
        if said:
            self.ev.log(f"stream producer: {key} put after {time.monotonic() - t0:.1f} s")

    def report(self, done: int) -> None:
        self.ev.metric({"pool_samples": len(self.pool.keys), "pool_bytes": self.pool.bytes,
                        "produced": done, "tokens": self.tokens,
                        "paused_s": self.pool.paused_s, "put_s": self.put_s}, name=PRODUCER)

    def produce(self, sample_of: Callable[[int], Sample], plan: po.PlanOrder,
                report_every: int = 64) -> Produced:
        """Put the held-out samples, then every sample of the plan's steps, then wait until the
        trainer has taken them all; a restarted trainer's new plan starts it over. The encodes
        run on this thread alone (engine/data/one_thread.py): a forward has the cores."""
        while True:
            try:
                with one_thread_here():
                    return self._produce(sample_of, plan, report_every)
            except Replan as r:
                plan = r.plan
                self.ev.log(f"stream producer: the trainer asks again from its step "
                            f"{plan.start}; producing its new plan")

    def _produce(self, sample_of: Callable[[int], Sample], plan: po.PlanOrder,
                 report_every: int) -> Produced:
        self.plan = plan
        done = pg.steps_done(self.progress(), plan)
        todo: list[tuple[str, int, int | None]] = [
            (keys.held_key(self.run, i), i, None) for i in plan.held]
        steps = [(keys.sample_key(self.run, e, i), i, s)
                 for s, (e, idx) in enumerate(plan.steps) for i in idx]
        todo += [t for t in steps if t[2] >= done]
        self.pool.keep_only({k: s for k, _, s in todo}, self.client.remove)
        self._adopt(todo, [k for k, _, s in steps if s < done])
        if done:
            self.ev.log(f"stream producer: the trainer has done {done} steps of its plan; "
                        f"producing from its step {plan.start + done}")
        for n, (key, i, step) in enumerate(todo, 1):
            self.beat()
            if key not in self.pool.keys:  # else put before and not taken yet
                self.put(key, sample_of(i), self.manifest.spec(i), step)
            self.ev.progress(n, len(todo), unit="sample", desc="stream put")
            if n % report_every == 0:
                self.report(n)
        self.report(len(todo))
        self.ev.log(f"stream producer: all {len(todo)} samples put; waiting for the trainer to "
                    "take the rest")
        self.pool.drain()
        self.client.remove([keys.manifest_key(self.run), keys.beat_key(self.run),
                            keys.ack_key(self.run)])
        return Produced(len(todo), self.total_bytes, self.put_s, self.pool.paused_s,
                        self.pool.pauses, self.pool.peak)


    def _adopt(self, todo: list[tuple[str, int, int | None]], trained: list[str]) -> None:
        """Into the pool: what the store already holds of `todo` (put before a kill); out of
        the store: what it still holds of the steps already trained on."""
        new = [t for t in todo if t[0] not in self.pool.keys]
        there = self._exists([k for k, _, _ in new] + trained)
        found = [t for t, x in zip(new, there, strict=False) if x]
        for key, i, step in found:
            self.pool.add(key, codec.encoded_size(self.manifest.spec(i)), step)
        stale = [k for k, x in zip(trained, there[len(new):], strict=True) if x]
        self.client.remove(stale)
        if found or stale:
            self.ev.log(f"stream producer: {len(found)} samples of the plan already in the "
                        f"store (kept); {len(stale)} the trainer is done with removed")


@contextlib.contextmanager
def beating(p: Producer, every_s: float = 1.0) -> Iterator[None]:
    """The heartbeat kept up from a thread while the caller does something long that does not
    use the store client meanwhile (a capture starting vLLM: a minute or more), so a waiting
    trainer does not take the producer for dead."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(every_s):
            p.beat()

    t = threading.Thread(target=run, name="stream-beat", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


def produce_data(data: FeatureData, client: StoreClient, run: str, marks: Watermarks,
                 ev: Emitter, dtype: str, digest: str | None = None,
                 plan_timeout_s: float | None = None) -> Produced:
    """Stream a FeatureData (a prepared directory): manifest, plan, samples."""
    p = Producer(client, run, marks, ev)
    p.publish(mf.build(data, dtype, dict(data.meta), digest))
    plan = p.wait_plan(plan_timeout_s)
    return p.produce(data.__getitem__, plan)
