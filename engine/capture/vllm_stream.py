"""`engine stream-capture`: the executor capture (vLLM in this process, our worker extension in
every TP worker: engine/capture/vllm_engine.py) as the producer of a stream run, so features go
from the target's forward into training without a data directory.

    python -m engine stream-capture --target T --data conv.jsonl --to HOST:RPC/META --run R \\
        [--tp 8 --gpu-memory-utilization 0.85 --batch-tokens 16384 ...]

The conversations are tokenised, ordered and checked exactly as `prepare --vllm-engine` does
(engine/capture/vllm_capture.py `plan_capture`), and sample i of the run is sample i of the
data directory that command would write. So the manifest (lengths, loss counts, token ids,
hidden width, aux layer ids, dtype, the target's config hash) is complete before vLLM starts; it
is published first, so the trainer computes its vocab and batch plan while vLLM loads. Then the
trainer's plan is awaited and its samples are prefilled in the plan's order, in engine calls of
up to --batch-tokens tokens, and put through engine/stream/producer.py's pool: a pipeline of
three, one thread asking vLLM for the next call, one checking and norming the samples of the
one before, while this one encodes and puts the samples of the one before that.

Each sample travels as the data directory stores it: the aux states, and the final state
through the target's final norm (applied here, engine/ckpt/final_norm.py). The checks of the
offline path run here too, before a checked sample is put: vLLM's prompt log-prob self-check
on the first sample of every --check-every'th call and the reference check.

The run's digest (the trainer's `data_sha256`) hashes what fixes the features: the capture's
settings (the target's config hash, the source's hash, --max-len, dtype, layer ids) and every
sample's token ids and loss mask. The same command on the same inputs gives the same digest, so
a trainer resumed against a restarted producer accepts it; it is not a data directory's (that
hashes its manifest.json, which records timings), and nothing of the vocab or the batch plan
depends on it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor

from engine.capture.vllm_capture import CapturePlan, plan_capture
from engine.capture.vllm_engine import (
    Captured,
    EngineCapture,
    Features,
    batches,
    start_engine,
)
from engine.data.features import FeatureData, Sample
from engine.data.one_thread import one_thread
from engine.errors import EngineError
from engine.events import Emitter
from engine.stream import keys
from engine.stream import manifest as mf
from engine.stream.address import StreamAddress
from engine.stream.pool import Watermarks
from engine.stream.producer import Producer, beating
from engine.stream.store import StoreClient

VIA = "vllm-engine-stream"


class PlannedData(FeatureData):
    """The capture plan's samples in the data directory's order, tokens only: what the stream
    manifest is built from before any forward (engine/stream/manifest.py `build`)."""

    def __init__(self, cp: CapturePlan) -> None:
        self.path = cp.data_path
        self.items = [cp.samples[i] for i in cp.order]
        self.lengths = [len(t.input_ids) for _, t in self.items]
        self.loss_counts = [int(sum(t.loss_mask[2:])) for _, t in self.items]
        self.hidden_size = int(cp.cfg["hidden_size"])
        self.aux_layer_ids = list(cp.aux_ids)
        self.meta = {}

    def __getitem__(self, i: int) -> Sample:
        raise EngineError("stream-capture: the states of a sample come from vLLM, not the plan")

    def tokens(self, i: int) -> tuple[Tensor, Tensor]:
        t = self.items[i][1]
        return torch.tensor(t.input_ids), torch.tensor(t.loss_mask)


def digest(cp: CapturePlan, m: mf.StreamManifest) -> str:
    """The run's content digest (module docstring)."""
    h = hashlib.sha256(json.dumps({
        "via": VIA, "target_config_sha256": cp.fp["target_config_sha256"],
        "source_sha256": cp.fp["source_sha256"], "max_len": cp.max_len, "dtype": m.dtype,
        "layer_ids": cp.spec.layer_ids}, sort_keys=True).encode())
    h.update(m.ids.numpy().tobytes())
    h.update(m.masks.numpy().tobytes())
    return h.hexdigest()


def stream_manifest(cp: CapturePlan, marks: Watermarks, tp: int) -> mf.StreamManifest:
    data = PlannedData(cp)
    dtype = str(cp.store).removeprefix("torch.")
    meta = cp.manifest([], 0.0, {"via": VIA, "tp": tp})
    meta["pool"] = {"high_samples": marks.high_samples, "high_bytes": marks.high_bytes}
    m = mf.build(data, dtype, meta, "")
    return mf.StreamManifest(m.lengths, m.loss_counts, m.hidden_size, m.aux_layer_ids, m.dtype,
                             m.argmax, m.meta, digest(cp, m), m.ids, m.masks)


class PlanFeed:
    """`sample_of` for Producer.produce: the samples in the order the producer asks for them
    (the plan's: held-out, then each step's), prefilled ahead in engine calls of up to
    `batch_tokens` tokens and checked and normed on two threads while the caller encodes and
    puts the last call's.

    What comes next is read off the producer's plan and pool (the samples it will skip are in
    the pool already); a request off that prediction (a restarted trainer's new plan) drops
    what was prefilled ahead and predicts again from the request."""

    def __init__(self, engine: EngineCapture, feats: Features, cp: CapturePlan,
                 producer: Producer, batch_tokens: int, check_every: int) -> None:
        self.engine, self.feats, self.cp, self.producer = engine, feats, cp, producer
        self.batch_tokens, self.check_every = batch_tokens, check_every
        self.ahead: deque[int] = deque()  # predicted, not yet asked of vLLM
        # calls in the making: (samples, their features' future, vLLM's prefill's future)
        self.pending: deque[tuple[list[int], Future[list[tuple[int, Sample]]],
                                  Future[list[Captured]]]] = deque()
        self.ready: deque[tuple[int, Sample]] = deque()
        self.calls = 0
        self.tokens = 0
        self.first: float | None = None
        self.last = 0.0
        self.wait_s = 0.0  # the producer waiting for samples (prefilled, checked, normed)
        self.features_s = 0.0  # checks and norm (on their thread, beside prefills and puts)
        self.prefiller = ThreadPoolExecutor(1, thread_name_prefix="capture-prefill")
        self.featurer = ThreadPoolExecutor(1, thread_name_prefix="capture-features",
                                           initializer=one_thread)

    def __call__(self, i: int) -> Sample:
        if self.first is None:
            self.first = time.monotonic()
        while True:
            if not self.ready:
                if not self.pending and not self.ahead or not self._expects(i):
                    self._predict(i)
                self._next_call()
            j, sample = self.ready.popleft()
            if j == i:
                self.tokens += len(sample.input_ids)
                self.last = time.monotonic()
                return sample
            if not self._expects(i):  # neither skipped nor ahead: predicted wrongly
                self._predict(i)

    def _expects(self, i: int) -> bool:
        return any(j == i for j, _ in self.ready) or any(i in b for b, _, _ in self.pending) \
            or i in self.ahead

    def _predict(self, i: int) -> None:
        """Drop what was prefilled ahead; what the producer will ask for from `i` on."""
        self._drop()
        self.ready.clear()
        plan, held = self.producer.plan, self.producer.pool.keys
        assert plan is not None
        todo = [(keys.held_key(self.producer.run, j), j) for j in plan.held]
        todo += [(keys.sample_key(self.producer.run, e, j), j) for e, idx in plan.steps
                 for j in idx]
        todo = [(k, j) for k, j in todo if k not in held]
        at = next((n for n, (_, j) in enumerate(todo) if j == i), None)
        self.ahead = deque([i] if at is None else [j for _, j in todo[at:]])

    def _submit(self) -> None:
        """The next engine call's samples off `ahead`, made on the thread."""
        if not self.ahead:
            return
        lens = [len(self.cp.samples[self.cp.order[j]][1].input_ids) for j in self.ahead]
        cut = batches(lens, self.batch_tokens)[:2]
        batch = [self.ahead.popleft() for _ in range(len(cut[0]))]
        # the call after this one, as it will be asked for unless the prediction changes:
        # vLLM steps it as soon as this one's step ends (EngineCapture.prefill)
        then = None if len(cut) < 2 else (
            self._prompts([self.ahead[k] for k in range(len(cut[1]))]),
            self._checked(self.calls + 1))
        checked = self._checked(self.calls)
        self.calls += 1
        prefill = self.prefiller.submit(self.engine.prefill, self._prompts(batch), checked,
                                        then)
        self.pending.append((batch, self.featurer.submit(self._make, batch, checked, prefill),
                             prefill))

    def _prompts(self, batch: list[int]) -> list[list[int]]:
        return [self.cp.samples[self.cp.order[j]][1].input_ids for j in batch]

    def _checked(self, call: int) -> set[int]:
        """The requests of engine call `call` that vLLM's prompt log-probs check."""
        return {0} if self.check_every and call % self.check_every == 0 else set()

    def _make(self, batch: list[int], checked: set[int], prefill: Future[list[Captured]]
              ) -> list[tuple[int, Sample]]:
        """(On the features thread.) The samples of one engine call, checked and normed."""
        got = prefill.result()
        t0 = time.monotonic()
        out = []
        for k, (j, cap) in enumerate(zip(batch, got, strict=True)):
            sid, t = self.cp.samples[self.cp.order[j]]
            aux, final = self.feats(sid, t.input_ids, cap, k in checked)
            out.append((j, Sample(torch.tensor(t.input_ids), torch.tensor(t.loss_mask),
                                  aux, final)))
        self.features_s += time.monotonic() - t0
        return out

    def _next_call(self) -> None:
        """The oldest call's samples made ready; two more in the making meanwhile (one being
        prefilled by vLLM, one being checked and normed), so neither vLLM nor the puts wait."""
        if not self.pending:
            self._submit()
        _, fut, _ = self.pending.popleft()
        while len(self.pending) < 2 and self.ahead:
            self._submit()
        t0 = time.monotonic()
        self.ready.extend(fut.result())
        self.wait_s += time.monotonic() - t0

    def _drop(self) -> None:
        """Calls in the making dropped: cancelled, or let end with their result unwanted."""
        for _, made, prefill in self.pending:
            for f in (made, prefill):
                f.cancel()
        for _, made, prefill in self.pending:
            for f in (made, prefill):
                if not f.cancelled():
                    f.exception()
        self.pending.clear()

    def close(self) -> None:
        self._drop()
        self.featurer.shutdown(wait=True)
        self.prefiller.shutdown(wait=True)


def stream_capture(target_dir: str, data_path: str, address: StreamAddress, run: str,
                   marks: Watermarks, *, tp: int = 1, gpu_memory_utilization: float = 0.9,
                   max_len: int = 2048, dtype: str | None = None, batch_tokens: int = 16384,
                   engine_args: dict[str, Any] | None = None, check_every: int = 16,
                   reference: str = "auto", plan_timeout_s: float | None = None,
                   ev: Emitter) -> dict[str, Any]:
    """Produce stream run `run` from the conversations (module docstring); the summary."""
    if tp < 1 or check_every < 0 or max_len < 4 or batch_tokens < 1:
        raise EngineError(f"--tp {tp} / --check-every {check_every} / --max-len {max_len} / "
                          f"--batch-tokens {batch_tokens}: must be >= 1 / >= 0 / >= 4 / >= 1")
    keys.check_run(run, "--run")
    cp = plan_capture(target_dir, data_path, None, max_len, dtype, 1024, batch_tokens, 0.0, ev)
    manifest = stream_manifest(cp, marks, tp)
    # lends no memory: the objects live in the store's holder and outlive this process
    client = StoreClient(address)
    try:
        producer = Producer(client, run, marks, ev)
        producer.publish(manifest)
        ev.log(f"stream run {run}: manifest of {len(manifest.lengths)} samples "
               f"({sum(manifest.lengths)} tokens) published; starting vLLM")
        with beating(producer):
            engine, feats = start_engine(cp, tp, gpu_memory_utilization, max_len, batch_tokens,
                                         engine_args, check_every, reference, ev)
        try:
            plan = producer.wait_plan(plan_timeout_s)
            feed = PlanFeed(engine, feats, cp, producer, batch_tokens, check_every)
            t0 = time.monotonic()
            try:
                got = producer.produce(feed, plan)
            finally:
                feed.close()
            seconds = time.monotonic() - t0
            files = engine.files()  # how many memory files the states took (reused)
        finally:
            engine.close()
    finally:
        client.close()
    busy = feed.last - feed.first if feed.first is not None else 0.0
    return {"run": run, "samples": got.samples, "bytes": got.bytes, "put_s": got.put_s,
            "paused_s": got.paused_s, "pauses": got.pauses, "peak_in_flight": got.peak,
            "tokens": feed.tokens, "capture_s": round(busy, 3),
            "tokens_per_s": round(feed.tokens / busy, 1) if busy > 0 else None,
            "seconds": round(seconds, 3), "engine_calls": engine.calls,
            "engine_steps": engine.steps, "memory_files": files,
            "prefill_wait_s": round(feed.wait_s, 3), "features_s": round(feed.features_s, 3),
            "engine_start_s": round(engine.start_seconds, 1), "model": engine.info["model"],
            "how": engine.info["how"], "digest": manifest.digest,
            "self_check": feats.checks, "reference_check": feats.reference.summary()}
