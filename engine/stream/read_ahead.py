"""A trainer rank's next micro-batches, read from the store in a thread while the rank computes.

The thread walks the rank's plan in order: for each sample it waits until the producer has put
it, reads it into a buffer of its own (registered with the same store client: Mooncake's client
takes calls from several threads, but a registered buffer is one reader's) and decodes it (a
copy: the buffer is reused). It keeps at most `depth` micro-batches decoded ahead of the
trainer, and it reads only: the keys are removed by the trainer's ack once the optimizer step
that used them is done, so a micro-batch read ahead and never trained on stays in the store for
the producer and `finish()`, as it would have without the thread.

`take()` runs in the training loop. It hands over the next micro-batch, and while that one is
not ready yet it calls `heed(key)` (with the key the thread waits for, None while it reads), so
the waiting is said, the producer's silence watched and a give-up raised in the training loop.
An error of the thread is raised by the `take()` that reaches it. What the training loop spent
blocked is split by what the thread was doing meanwhile: waiting for the producer, or reading.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from engine.data.features import Sample
from engine.data.one_thread import one_thread
from engine.errors import EngineError
from engine.stream import codec, keys
from engine.stream.manifest import StreamManifest
from engine.stream.store import Buffer, StoreClient

#: how many `poll_s` at most between two looks for a sample the caller does not wait for yet
_SLOW_POLLS = 8

#: one micro-batch of the plan: its epoch and its sample indices
Micro = tuple[int, tuple[int, ...]]


class _Stopped(Exception):
    """close() while the thread waits: it ends quietly."""


class ReadAhead:
    def __init__(self, client: StoreClient, run: str, manifest: StreamManifest, plan: list[Micro],
                 depth: int = 2, poll_s: float = 0.01) -> None:
        self.client, self.run, self.manifest = client, run, manifest
        self.depth, self.poll_s = max(1, depth), poll_s
        self.buffer = Buffer(client)
        self._plan = list(plan)
        self._ready: deque[tuple[tuple[int, ...], list[Sample]]] = deque()
        self._error: BaseException | None = None
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._wake = threading.Event()  # the caller blocks (or close()): look again at once
        self._asked = False  # whether the caller is blocked on the thread
        # what the thread is doing ("wait" for the producer, "read", or None) since when, and
        # the seconds it has spent on each before that
        self._mode: str | None = None
        self._key: str | None = None
        self._since = time.monotonic()
        self._spent = {"wait": 0.0, "read": 0.0}
        #: when each micro-batch was ready, in plan order (what a test can look at)
        self.ready_at: list[float] = []
        self._thread = threading.Thread(target=self._run, name="stream-read-ahead", daemon=True)
        self._thread.start()

    # -- the thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        one_thread()  # its decode copies stay out of the training step's OpenMP team
        try:
            for epoch, idx in self._plan:
                with self._cv:
                    while len(self._ready) >= self.depth and not self._stop.is_set():
                        self._cv.wait()
                if self._stop.is_set():
                    return
                got = [self._read(keys.sample_key(self.run, epoch, i), i) for i in idx]
                with self._cv:
                    self._ready.append((idx, got))
                    self.ready_at.append(time.monotonic())
                    self._cv.notify_all()
        except _Stopped:
            return
        except BaseException as e:  # raised again in the training loop by take()
            with self._cv:
                self._error = e
                self._cv.notify_all()
        finally:
            self._doing(None)

    def _read(self, key: str, i: int) -> Sample:
        self._doing("wait", key)
        pause = self.poll_s
        while self.client.size(key) is None:
            # ahead of the caller, the store is asked less often (the producer's pool may be
            # full until the caller's ack); a blocked caller is served at `poll_s`
            self._wake.wait(pause)
            self._wake.clear()
            if self._stop.is_set():
                raise _Stopped
            pause = self.poll_s if self._asked else min(2 * pause, _SLOW_POLLS * self.poll_s)
        self._doing("read")
        return codec.decode(self.client.get_into(key, self.buffer), self.manifest.spec(i), key)

    def _doing(self, mode: str | None, key: str | None = None) -> None:
        with self._cv:
            now = time.monotonic()
            if self._mode is not None:
                self._spent[self._mode] += now - self._since
            self._mode, self._key, self._since = mode, key, now

    # -- the training loop --------------------------------------------------------------------
    def spent(self) -> tuple[float, float]:
        """The thread's seconds so far waiting for the producer and reading (the ongoing
        stretch included)."""
        with self._cv:
            out = dict(self._spent)
            if self._mode is not None:
                out[self._mode] += time.monotonic() - self._since
            return out["wait"], out["read"]

    def take(self, idx: tuple[int, ...], heed: Callable[[str | None], None]
             ) -> tuple[list[Sample], float, float]:
        """The next micro-batch's samples (it must be `idx`), and the seconds the caller was
        blocked while the thread waited for the producer and while it read."""
        w0, r0 = self.spent()
        blocked = False
        try:
            while True:
                with self._cv:
                    if self._ready:
                        got_idx, got = self._ready.popleft()
                        self._cv.notify_all()
                        break
                    if self._error is not None:
                        raise self._error
                    if not self._thread.is_alive():
                        raise EngineError(f"stream run {self.run}: the trainer asked for "
                                          f"samples {idx} past its plan")
                    if blocked:
                        self._cv.wait(self.poll_s)
                    else:
                        self._asked = True
                        self._wake.set()
                    waiting = self._key if self._mode == "wait" else None
                if blocked:
                    heed(waiting)
                blocked = True
        finally:
            self._asked = False
        if got_idx != idx:  # StreamData checks the plan order first: this is our own slip
            raise EngineError(f"stream run {self.run}: read ahead {got_idx}, asked for {idx}")
        if not blocked:
            return got, 0.0, 0.0
        w1, r1 = self.spent()
        return got, w1 - w0, r1 - r0

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        with self._cv:
            self._cv.notify_all()
        self._thread.join(timeout=30)
