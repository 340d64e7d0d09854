"""A trainer rank's long wait for the producer, said by rank 0.

Only rank 0 writes a run's events. When another rank waits for a sample the producer has not
put (a producer stopped after putting rank 0's share of a step), rank 0 has its samples and
sits in the step's collective with nothing to say, and the run looks hung. So a rank other than
0 whose wait passes the trainer's `say_s` tells rank 0 through the store (`WaitTeller`): it
puts RUN/wait/RANK (the key it waits for, how long it has waited, how long the producer has
been silent by its own clock, a counter raised at each put) at most every `every_s`, and
removes it when the wait ends. A rank that gives up on a silent producer puts its error there
before it stops.

Rank 0 looks at its peers' records every `every_s` in a thread (`PeerWaits`): it says each wait
once, the producer's silence as the waiting rank measured it (every `silent_say_s`, as for its
own waits), a give-up, and the end of the wait. A record whose counter does not move is one a
killed rank left behind: it is never said, and rank 0 removes its peers' records when it puts
its plan and at the end of the run.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.data.one_thread import one_thread
from engine.stream import keys
from engine.stream.store import Buffer, StoreClient


@dataclass(frozen=True)
class WaitRecord:
    key: str  # the sample key the rank waits for
    waited_s: float
    silent_s: float  # the producer's silence by the waiting rank's clock
    n: int  # raised at each put: a record that does not move was left by a killed rank
    gave_up: str = ""  # the rank's one-line error when it stopped waiting


def encode(r: WaitRecord) -> bytes:
    return json.dumps({"key": r.key, "waited_s": r.waited_s, "silent_s": r.silent_s,
                       "n": r.n, "gave_up": r.gave_up}).encode()


def decode(raw: bytes) -> WaitRecord | None:
    """The record, or None for bytes that are not one (nothing a rank 0 can say)."""
    try:
        d = json.loads(raw)
        return WaitRecord(str(d["key"]), float(d["waited_s"]), float(d["silent_s"]),
                          int(d["n"]), str(d.get("gave_up", "")))
    except (ValueError, KeyError, TypeError):
        return None


def waiting_line(key: str, rank: int | None = None) -> str:
    """What the trainer says of a wait for sample `key` (another rank's: `rank`)."""
    who = "" if rank is None else f"rank {rank} "
    return f"stream trainer: {who}waiting for sample {key} (the producer lags)"


def silent_line(seconds: float, key: str, rank: int | None = None) -> str:
    """What the trainer says of a producer silent while it (or `rank`) waits for `key`."""
    who = "" if rank is None else f"rank {rank} "
    return (f"stream trainer: producer silent for {seconds:.0f} s ({who}waiting for {key}); "
            "still waiting: a producer started again is picked up")


def peer_keys(run: str, world: int) -> list[str]:
    return [keys.wait_key(run, r) for r in range(1, world)]


class WaitTeller:
    """A rank other than 0: its long waits, put where rank 0 looks."""

    def __init__(self, client: StoreClient, run: str, rank: int, every_s: float = 1.0) -> None:
        self.client, self.key, self.every_s = client, keys.wait_key(run, rank), every_s
        self.n = 0
        self._told = 0.0  # monotonic time of the last put; 0: nothing of this wait put

    def tell(self, key: str, waited_s: float, silent_s: float, gave_up: str = "") -> None:
        now = time.monotonic()
        if not gave_up and now - self._told < self.every_s:
            return
        self.n += 1
        self.client.put_bytes(self.key, encode(WaitRecord(key, waited_s, silent_s, self.n,
                                                          gave_up)))
        self._told = now

    def done(self) -> None:
        """The wait ended: its record goes."""
        if self._told:
            self.client.remove([self.key])
            self._told = 0.0


@dataclass
class _Seen:
    rec: WaitRecord
    moved: float | None = None  # when its counter last moved (None: not yet seen moving)
    said: str = ""  # the key its wait was said for
    said_silent: int = 0  # how many `silent_say_s` of the producer's silence were said
    said_gave_up: bool = False


class PeerWaits:
    """Rank 0: says its peers' waits (module docstring) through `say(msg, level)`, and hands
    each silence they measured to `on_silence` (for the trainer's metric)."""

    def __init__(self, client: StoreClient, run: str, world: int,
                 say: Callable[[str, str], None], on_silence: Callable[[float], None],
                 silent_say_s: float, every_s: float = 1.0) -> None:
        self.client, self.keys = client, peer_keys(run, world)
        self.say, self.on_silence = say, on_silence
        self.silent_say_s, self.every_s = silent_say_s, every_s
        self.buffer = Buffer(client)  # the training thread reads through the client's own
        self._seen: dict[int, _Seen] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stream-peer-waits", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        one_thread()
        while not self._stop.wait(self.every_s):
            try:
                self.look()
            except Exception as e:  # the training loop meets a broken store on its own
                self.say(f"stream trainer: stopped looking at the other ranks' waits "
                         f"({type(e).__name__}: {e})", "warning")
                return

    def look(self) -> None:
        now = time.monotonic()
        for rank, (key, here) in enumerate(zip(self.keys, self.client.exists(self.keys),
                                               strict=True), start=1):
            raw = self.client.get_bytes(key, ready_s=1.0, buffer=self.buffer) if here else None
            rec = decode(raw) if raw is not None else None
            seen = self._seen.get(rank)
            if rec is None:
                if seen is not None and seen.said:
                    self.say(f"stream trainer: rank {rank} waited {seen.rec.waited_s:.0f}+ s "
                             f"for {seen.said}", "info")
                self._seen.pop(rank, None)
                continue
            if seen is None:
                self._seen[rank] = _Seen(rec)
                continue
            if rec.n != seen.rec.n:
                seen.moved = now
            seen.rec = rec
            if seen.moved is None or now - seen.moved > 3 * self.every_s:
                continue  # left by a killed rank (or not yet seen to be alive)
            self._relay(rank, seen)

    def _relay(self, rank: int, seen: _Seen) -> None:
        rec = seen.rec
        if seen.said != rec.key:
            self.say(waiting_line(rec.key, rank), "info")
            seen.said, seen.said_silent = rec.key, 0
        self.on_silence(rec.silent_s)
        n = int(rec.silent_s // self.silent_say_s)
        if n > seen.said_silent:
            self.say(silent_line(rec.silent_s, rec.key, rank), "info")
        seen.said_silent = n
        if rec.gave_up and not seen.said_gave_up:
            self.say(f"stream trainer: rank {rank}: {rec.gave_up}", "error")
            seen.said_gave_up = True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
