"""The trainer's side of a stream run: a FeatureData whose samples come out of the store.

    python -m engine train --target T --from-stream HOST:RPC/META --data RUN --out OUT

Opening waits for the producer's manifest (lengths, loss counts, tokens: the batch plan, the
vocab and the losses come out as an offline run's on the same data). Before the first step,
rank 0 puts the plan's sample order (engine/stream/plan_order.py), refusing a pool too small
for the held-out samples plus one step. Each rank then reads its micro-batches in plan order,
waiting for a sample the producer has not put yet (each wait longer than `say_s` is said, and
the totals are in the `stream trainer` metric), and after the optimizer step that used them
`ack()` removes them: that is what lets the producer go on, and rank 0 then records the steps
done under its plan's nonce (RUN/ack, engine/stream/progress.py) for a producer started again.
Held-out samples stay for every estimate and are removed by `finish()` when the run is done.

While it waits, the trainer watches the producer's heartbeat: after `silent_say_s` without a
beat it says "producer silent for N s" (and again every `silent_say_s`), puts the longest
silence in its `stream trainer` metric, and keeps waiting, so a producer started again is
picked up; with `give_up_s` it stops instead, with one line, after that much silence. Only
rank 0 writes the run's events: another rank's long wait is told to it through the store and
said by it (engine/stream/peer_waits.py), since rank 0 may have its samples and sit in the
step's collective meanwhile.

The plan's micro-batches are read ahead (engine/stream/read_ahead.py): while the rank computes
one, a thread waits for, reads and decodes the next `read_ahead`. The waiting is said and
watched here all the same, in the training loop, and `wait_s`/`read_s` count only what the
training loop spent blocked on it. Held-out samples (the estimates) are read when asked for.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from typing import Any

import torch
from torch import Tensor

from engine.data.features import FeatureData, Sample, collate, collate_packed
from engine.errors import EngineError
from engine.events import Emitter
from engine.stream import codec, keys
from engine.stream import manifest as mf
from engine.stream import plan_order as po
from engine.stream import progress as pg
from engine.stream.address import StreamAddress
from engine.stream.peer_waits import (
    PeerWaits,
    WaitTeller,
    peer_keys,
    silent_line,
    waiting_line,
)
from engine.stream.read_ahead import ReadAhead
from engine.stream.store import StoreClient

#: the metric event's name for the trainer's waiting figures
TRAINER = "stream trainer"


class StreamData(FeatureData):
    def __init__(self, address: StreamAddress, run: str, ev: Emitter,
                 poll_s: float = 0.01, say_s: float = 1.0, silent_say_s: float = 5.0,
                 give_up_s: float | None = None, read_ahead: int = 2) -> None:
        self.run, self.ev = keys.check_run(run, "--data"), ev
        self.poll_s, self.say_s = poll_s, say_s
        self.silent_say_s, self.give_up_s = silent_say_s, give_up_s
        self.read_ahead = read_ahead
        self.ahead: ReadAhead | None = None
        self.peers: PeerWaits | None = None  # rank 0 of several: the others' waits said
        self.teller: WaitTeller | None = None  # another rank: its waits told to rank 0
        self.client = StoreClient(address, 0)
        beat = keys.beat_key(run)
        self.silence = pg.Silence(lambda: self.client.get_bytes(beat))
        self.silent_s = 0.0  # the longest silence of the producer since the last metric
        self._silent_lock = threading.Lock()  # rank 0's PeerWaits adds what its peers saw
        self.rank, self.world, self.nonce, self.done_steps = 0, 1, "", 0
        self._said_silent = 0  # how many `silent_say_s` of this silence were said
        self._steps: deque[tuple[int, tuple[int, ...]]] = deque()  # rank 0: every rank's
        key = keys.manifest_key(run)
        raw = self._wait_bytes(key, "the producer's manifest")
        m = self.manifest = mf.decode(raw, key)
        self.path = f"stream://{address}/{run}"
        self.lengths, self.loss_counts = list(m.lengths), list(m.loss_counts)
        self.hidden_size = m.hidden_size
        self.aux_layer_ids = list(m.aux_layer_ids) if m.aux_layer_ids else None
        self.meta = dict(m.meta)
        self.has_target_argmax = m.argmax
        self.digest = m.digest
        self._next: deque[tuple[int, tuple[int, ...]]] = deque()
        self._held: set[int] = set()
        self._taken: list[str] = []
        self.wait_s, self.waits, self.read_s, self.ack_s = 0.0, 0, 0.0, 0.0
        ev.log(f"streaming {len(self.lengths)} samples of run {run} from the store at {address}")

    def _wait_bytes(self, key: str, what: str) -> bytes:
        t0, said = time.monotonic(), False
        self.silence.begin()
        while True:
            raw = self.client.get_bytes(key)
            if raw is not None:
                return raw
            if not said and time.monotonic() - t0 > self.say_s:
                self.ev.log(f"stream trainer: waiting for {what} ({key})")
                said = True
            self._heed_silence(key)
            time.sleep(self.poll_s * 5)

    def _saw_silence(self, s: float) -> None:
        with self._silent_lock:
            self.silent_s = max(self.silent_s, s)

    def _heed_silence(self, key: str) -> float:
        """While waiting for `key`: say a silent producer, or give up (module docstring); the
        producer's silence so far."""
        s = self.silence.seconds()
        self._saw_silence(s)
        if s < self.silent_say_s:
            self._said_silent = 0
            return s
        if self.give_up_s is not None and s >= self.give_up_s:
            raise EngineError(f"stream run {self.run}: the producer has been silent for {s:.0f} "
                              f"s while the trainer waits for {key} (--producer-timeout "
                              f"{self.give_up_s:g}); start it again and resume with --resume")
        n = int(s // self.silent_say_s)
        if n > self._said_silent:
            self._said_silent = n
            self.ev.log(silent_line(s, key))
        return s

    # -- the plan ----------------------------------------------------------------------------
    def plan_steps(self, steps: list[Any], held: list[int], start: int, rank: int,
                   world: int) -> None:
        """Remember this rank's micro-batches in order and start reading them ahead; rank 0
        puts the whole order first."""
        self._held = set(held)
        self._next = deque((s.epoch, tuple(idx)) for s in steps for idx in s.for_rank(rank, world))
        self.rank, self.world, self.done_steps = rank, world, start
        self._watch_peers(rank, world)
        if rank == 0:
            self._steps = deque((s.epoch, tuple(s.samples())) for s in steps)
            self._check_pool(steps, held)
            self.nonce = f"{os.getpid()}-{time.time_ns()}"
            plan = po.PlanOrder(start, self.nonce, tuple(held),
                                tuple((s.epoch, tuple(s.samples())) for s in steps))
            self.client.put_bytes(keys.plan_key(self.run), po.encode(plan))
        if self.ahead is not None:
            self.ahead.close()
        self.ahead = ReadAhead(self.client, self.run, self.manifest, list(self._next),
                               self.read_ahead, self.poll_s)

    def _watch_peers(self, rank: int, world: int) -> None:
        self._stop_peers()
        if rank == 0 and world > 1:
            self.client.remove(peer_keys(self.run, world))  # what killed ranks left
            self.peers = PeerWaits(self.client, self.run, world,
                                   lambda msg, level: self.ev.log(msg, level=level),
                                   self._saw_silence, self.silent_say_s)
        elif rank > 0 and self.teller is None:
            self.teller = WaitTeller(self.client, self.run, rank)

    def _stop_peers(self) -> None:
        if self.peers is not None:
            self.peers.close()
            self.peers = None

    def _check_pool(self, steps: list[Any], held: list[int]) -> None:
        pool = self.meta.get("pool")
        if not isinstance(pool, dict) or not steps:
            return
        size = [codec.encoded_size(self.manifest.spec(i)) for i in range(len(self.lengths))]
        step = max(steps, key=lambda s: sum(size[i] for i in s.samples()))
        n = len(held) + max(len(s.samples()) for s in steps)
        nbytes = sum(size[i] for i in held) + sum(size[i] for i in step.samples())
        hs, hb = int(pool.get("high_samples", 0)), int(pool.get("high_bytes", 0))
        if n > hs or nbytes > hb:
            raise EngineError(
                f"--from-stream: the producer's pool (high watermark {hs} samples, "
                f"{hb / 2**20:.1f} MiB) cannot hold the held-out samples and one step "
                f"({n} samples, {nbytes / 2**20:.1f} MiB): raise stream-put's --high-samples/"
                "--high-gb, or lower --holdout, --batch-tokens or --grad-accum")

    # -- reading ------------------------------------------------------------------------------
    def _fetch(self, key: str, i: int) -> Sample:
        wait = _Wait(self)
        while self.client.size(key) is None:
            wait(key)
            time.sleep(self.poll_s)
        self._waited(wait, time.monotonic() - wait.t0)
        t1 = time.monotonic()
        s = codec.decode(self.client.get_into(key), self.manifest.spec(i), key)
        self.read_s += time.monotonic() - t1
        return s

    def _waited(self, wait: _Wait, waited: float) -> None:
        """Count a wait for the producer (one longer than a poll), and say its end if its
        start was said."""
        if waited > self.poll_s:
            self.wait_s += waited
            self.waits += 1
        if wait.said:
            self.ev.log(f"stream trainer: waited {waited:.2f} s for {wait.said}")
        if self.teller is not None:
            self.teller.done()

    def _samples(self, indices: tuple[int, ...] | list[int]) -> list[Sample]:
        idx = tuple(indices)
        if idx and idx[0] in self._held:
            return [self._fetch(keys.held_key(self.run, i), i) for i in idx]
        if not self._next or self._next[0][1] != idx:
            want = self._next[0][1] if self._next else "nothing"
            raise EngineError(f"stream run {self.run}: the trainer asked for samples {idx} out "
                              f"of its plan (next: {want})")
        epoch, _ = self._next.popleft()
        out = self._take(idx)
        self._taken += [keys.sample_key(self.run, epoch, i) for i in idx]
        return out

    def _take(self, idx: tuple[int, ...]) -> list[Sample]:
        """The next micro-batch from the read-ahead; a wait for the producer is said and
        watched as `_fetch` does."""
        assert self.ahead is not None  # plan_steps made it with self._next
        wait = _Wait(self)
        out, waited, read = self.ahead.take(idx, wait)
        self._waited(wait, waited)
        self.read_s += read
        return out

    def batch(self, indices: tuple[int, ...] | list[int]) -> dict[str, Tensor]:
        return collate(self._samples(indices))

    def packed(self, indices: tuple[int, ...] | list[int]) -> dict[str, Tensor]:
        return collate_packed(self._samples(indices))

    def __getitem__(self, i: int) -> Sample:
        return self._samples((i,))[0]

    def tokens(self, i: int) -> tuple[Tensor, Tensor]:
        return self.manifest.tokens(i)

    def describe(self, i: int) -> str:
        return f"stream run {self.run} sample {i}"

    def token_counts(self, vocab_size: int) -> Tensor:
        m = self.manifest
        ids = m.ids[m.masks.bool()].long()
        if ids.numel() and int(ids.max()) >= vocab_size or ids.numel() and int(ids.min()) < 0:
            raise EngineError(f"stream run {self.run}: token id {int(ids.max())} is outside the "
                              f"target's vocab of {vocab_size}")
        return torch.bincount(ids, minlength=vocab_size)[:vocab_size]

    # -- acknowledging ------------------------------------------------------------------------
    def ack(self, step: int) -> None:
        """The optimizer step `step` is done: remove the samples it read (this rank's); rank 0
        records the progress."""
        t0 = time.monotonic()
        self.client.remove(self._taken)
        self._taken = []
        self.done_steps = step
        if self.rank == 0:
            self._record()
            if self._steps:  # the run's accounting: which samples each step trained on
                epoch, idx = self._steps.popleft()
                self.ev.log(f"stream trainer: step {step} trained on epoch {epoch} samples "
                            f"{','.join(map(str, idx))}", level="debug")
        self.ack_s += time.monotonic() - t0
        with self._silent_lock:
            silent, self.silent_s = self.silent_s, 0.0
        self.ev.metric({"wait_s": self.wait_s, "waits": self.waits, "read_s": self.read_s,
                        "ack_s": self.ack_s, "producer_silent_s": silent},
                       step=step, name=TRAINER)

    def _record(self, done: bool = False) -> None:
        self.client.put_bytes(keys.ack_key(self.run),
                              pg.encode(pg.Progress(self.nonce, self.done_steps, done)))

    def finish(self) -> None:
        """The run is done (rank 0): said in the progress, then the held-out samples and the
        plan go."""
        self._record(done=True)
        self._stop_peers()
        self.client.remove([keys.held_key(self.run, i) for i in sorted(self._held)]
                           + [keys.plan_key(self.run)] + peer_keys(self.run, self.world))

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead.close()
        self._stop_peers()
        if self.teller is not None:
            with contextlib.suppress(EngineError):  # a store gone: nothing to tidy
                self.teller.done()
        self.client.close()


def open_stream_data(cfg: Any, ev: Emitter) -> StreamData:
    return StreamData(StreamAddress.parse(cfg.from_stream), cfg.data, ev,
                      give_up_s=cfg.producer_timeout)


class _Wait:
    """One wait of the training loop for a sample: called with the key the producer has not
    put yet (None while the read-ahead reads), it starts watching the producer's silence, says
    the wait once it passes `say_s`, and says or gives up on a silent producer."""

    def __init__(self, data: StreamData) -> None:
        self.data, self.t0 = data, time.monotonic()
        self.said = ""  # the key the wait was said for
        self.begun = False

    def __call__(self, key: str | None) -> None:
        if key is None:
            return
        d = self.data
        if not self.begun:
            d.silence.begin()
            self.begun = True
        if not self.said and time.monotonic() - self.t0 > d.say_s:
            d.ev.log(waiting_line(key))
            self.said = key
        try:
            s = d._heed_silence(key)
        except EngineError as e:
            if d.teller is not None:
                d.teller.tell(key, time.monotonic() - self.t0, d.silence.seconds(), str(e))
            raise
        if d.teller is not None and self.said:
            d.teller.tell(key, time.monotonic() - self.t0, s)
