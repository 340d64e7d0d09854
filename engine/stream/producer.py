"""The producer's side of a stream run: publish the manifest, wait for the trainer's plan, and
put each sample in the plan's order, paced by the in-flight pool (engine/stream/pool.py).

`produce(data, ...)` does it for any FeatureData (a prepared data directory today; a capture
hands its samples over the same way). The producer's client holds the store's memory for the
objects it puts, so it stays until the trainer has removed every one of them (`drain`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.data.features import FeatureData, Sample
from engine.errors import EngineError
from engine.events import Emitter
from engine.stream import codec, keys
from engine.stream import manifest as mf
from engine.stream import plan_order as po
from engine.stream.pool import InFlight, Watermarks
from engine.stream.store import StoreClient

#: the metric event's name for the producer's pool figures
PRODUCER = "stream producer"


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
                 look_s: float = 0.25) -> None:
        self.client, self.run, self.ev = client, keys.check_run(run), ev
        self.pool = InFlight(marks, client.exists, ev, between=self._look)
        self.plan: po.PlanOrder | None = None
        self.look_s, self._looked = look_s, 0.0
        self.put_s = 0.0
        self.total_bytes = 0

    def publish(self, manifest: mf.StreamManifest) -> None:
        self.manifest = manifest
        self.client.put_bytes(keys.manifest_key(self.run), mf.encode(manifest))

    def wait_plan(self, timeout_s: float | None = None, poll_s: float = 0.05) -> po.PlanOrder:
        key = keys.plan_key(self.run)
        t0 = time.monotonic()
        said = False
        while True:
            raw = self.client.get_bytes(key)
            if raw is not None:
                return po.decode(raw, key, len(self.manifest.lengths))
            if not said:
                self.ev.log(f"stream producer: waiting for the trainer's plan ({key})")
                said = True
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                raise EngineError(f"stream run {self.run}: no trainer asked for samples within "
                                  f"{timeout_s:.0f} s")
            time.sleep(poll_s)

    def _look(self) -> None:
        """Raise Replan when the trainer's plan is not the one being produced (looked at every
        `look_s` at most, while waiting)."""
        now = time.monotonic()
        if self.plan is None or now - self._looked < self.look_s:
            return
        self._looked = now
        key = keys.plan_key(self.run)
        raw = self.client.get_bytes(key)
        if raw is not None:
            plan = po.decode(raw, key, len(self.manifest.lengths))
            if plan.nonce != self.plan.nonce:
                raise Replan(plan)

    def put(self, key: str, sample: Sample, spec: codec.SampleSpec, step: int | None) -> None:
        """Put one sample of plan step `step` (None: held out), within the pool's marks."""
        n = codec.encoded_size(spec)
        self.pool.wait_room(n, key, step)
        t0 = time.perf_counter()
        size = codec.encode(sample, spec, self.client.buffer.ensure(n))
        self.client.put_from(key, size)
        self.put_s += time.perf_counter() - t0
        self.pool.add(key, size, step)
        self.total_bytes += size

    def report(self, done: int) -> None:
        self.ev.metric({"pool_samples": len(self.pool.keys), "pool_bytes": self.pool.bytes,
                        "produced": done, "paused_s": self.pool.paused_s,
                        "put_s": self.put_s}, name=PRODUCER)

    def produce(self, sample_of: Callable[[int], Sample], plan: po.PlanOrder,
                report_every: int = 64) -> Produced:
        """Put the held-out samples, then every sample of the plan's steps, then wait until the
        trainer has taken them all; a restarted trainer's new plan starts it over."""
        while True:
            try:
                return self._produce(sample_of, plan, report_every)
            except Replan as r:
                plan = r.plan
                self.ev.log(f"stream producer: the trainer asks again from its step "
                            f"{plan.start}; producing its new plan")

    def _produce(self, sample_of: Callable[[int], Sample], plan: po.PlanOrder,
                 report_every: int) -> Produced:
        self.plan = plan
        todo: list[tuple[str, int, int | None]] = [
            (keys.held_key(self.run, i), i, None) for i in plan.held]
        todo += [(keys.sample_key(self.run, e, i), i, s)
                 for s, (e, idx) in enumerate(plan.steps) for i in idx]
        self.pool.keep_only({k: s for k, _, s in todo}, self.client.remove)
        for n, (key, i, step) in enumerate(todo, 1):
            if key not in self.pool.keys:  # else put before and not taken yet
                self.put(key, sample_of(i), self.manifest.spec(i), step)
            self.ev.progress(n, len(todo), unit="sample", desc="stream put")
            if n % report_every == 0:
                self.report(n)
        self.report(len(todo))
        self.ev.log(f"stream producer: all {len(todo)} samples put; waiting for the trainer to "
                    "take the rest")
        self.pool.drain()
        self.client.remove([keys.manifest_key(self.run)])
        return Produced(len(todo), self.total_bytes, self.put_s, self.pool.paused_s,
                        self.pool.pauses, self.pool.peak)


def produce_data(data: FeatureData, client: StoreClient, run: str, marks: Watermarks,
                 ev: Emitter, dtype: str, digest: str | None = None,
                 plan_timeout_s: float | None = None) -> Produced:
    """Stream a FeatureData (a prepared directory): manifest, plan, samples."""
    p = Producer(client, run, marks, ev)
    p.publish(mf.build(data, dtype, dict(data.meta), digest))
    plan = p.wait_plan(plan_timeout_s)
    return p.produce(data.__getitem__, plan)
