"""What each side of a stream run tells the other besides the samples: the trainer's progress
(RUN/ack) and the producer's heartbeat (RUN/beat).

The progress is the number of optimizer steps the trainer has done, under the nonce of the plan
it wrote, and whether the run is done: a producer started again reads it and does not put again
what was already trained on. A plan with another nonce (a resumed trainer's) has done nothing
yet. The heartbeat is a counter the producer raises: the trainer measures silence on its own
clock, from the last time it saw the counter change, so the two hosts' clocks never meet.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.errors import EngineError
from engine.stream.plan_order import PlanOrder


@dataclass(frozen=True)
class Progress:
    nonce: str
    step: int  # the trainer's optimizer steps done in all (its step counter)
    done: bool = False


def encode(p: Progress) -> bytes:
    return json.dumps({"nonce": p.nonce, "step": p.step, "done": p.done}).encode()


def decode(raw: bytes, key: str) -> Progress:
    try:
        d = json.loads(raw)
        return Progress(str(d["nonce"]), int(d["step"]), bool(d["done"]))
    except (ValueError, KeyError, TypeError) as e:
        raise EngineError(f"stream progress {key}: unreadable ({type(e).__name__}: {e})"
                          ) from None


def steps_done(p: Progress | None, plan: PlanOrder) -> int:
    """How many of `plan`'s steps the trainer has done (0 under another plan's nonce)."""
    if p is None or p.nonce != plan.nonce:
        return 0
    return max(0, min(len(plan.steps), p.step - plan.start))


class Silence:
    """How long the producer's heartbeat has not moved, read through `get` at most every
    `look_s`; measured from the first look when there has been no beat at all."""

    def __init__(self, get: Callable[[], bytes | None], look_s: float = 1.0) -> None:
        self.get, self.look_s = get, look_s
        self.last: bytes | None = None
        self.moved = self.looked = time.monotonic()

    def begin(self) -> None:
        """A wait begins: silence counts from now at most (the beat is looked at at once)."""
        self.moved, self.looked = time.monotonic(), 0.0

    def seconds(self) -> float:
        now = time.monotonic()
        if now - self.looked >= self.look_s:
            self.looked = now
            beat = self.get()
            if beat is not None and beat != self.last:
                self.last, self.moved = beat, now
        return now - self.moved
