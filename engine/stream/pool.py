"""The bounded in-flight pool, as the producer keeps it: every sample it put that the trainer
has not acknowledged yet (removed from the store after the optimizer step that used it).

Two watermarks, in samples and in bytes. A put that would take the pool past a high mark waits
until the trainer has brought it down to both low marks (hysteresis: the producer does not
stutter one sample at a time), or until the trainer starves: when the sample to put belongs to
the earliest step the pool holds (or the pool holds no step at all), the trainer is waiting for
it, and waiting for low would deadlock both sides. The trainer checks that the held-out samples
plus its largest step fit under the high marks, so a starved put always fits once the pool holds
nothing of a later step: a restarted producer may find later steps in the store (put before its
kill) while an earlier one is missing, and then removes later steps' samples, the latest first,
to make room (they are put again in their turn). Each pause is
said twice, when it begins and when it ends with its length; the totals come back in
`paused_s` and `pauses`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.errors import EngineError
from engine.events import Emitter

DEFAULT_HIGH_SAMPLES = 256
DEFAULT_LOW_SAMPLES = 192


def default_high_bytes() -> int:
    """A quarter of the memory available now (the store's segment lives in this host's RAM)."""
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        avail = 8 << 30
    return max(64 << 20, avail // 4)


@dataclass(frozen=True)
class Watermarks:
    high_samples: int = DEFAULT_HIGH_SAMPLES
    low_samples: int = DEFAULT_LOW_SAMPLES
    high_bytes: int = 0
    low_bytes: int = 0

    @classmethod
    def make(cls, high_samples: int | None, low_samples: int | None, high_gb: float | None,
             low_gb: float | None) -> Watermarks:
        """From the command line; what is not given follows the defaults (low = 3/4 high)."""
        hs = high_samples if high_samples is not None else DEFAULT_HIGH_SAMPLES
        ls = low_samples if low_samples is not None else (
            DEFAULT_LOW_SAMPLES if high_samples is None else hs * 3 // 4)
        hb = int(high_gb * 2**30) if high_gb is not None else default_high_bytes()
        lb = int(low_gb * 2**30) if low_gb is not None else hb * 3 // 4
        marks = cls(hs, ls, hb, lb)
        marks.check()
        return marks

    def check(self) -> None:
        if not 0 <= self.low_samples < self.high_samples:
            raise EngineError(f"--low-samples {self.low_samples}: must be >= 0 and below "
                              f"--high-samples {self.high_samples}")
        if not 0 <= self.low_bytes < self.high_bytes:
            raise EngineError(f"--low-gb {self.low_bytes / 2**30:g}: must be >= 0 and below "
                              f"--high-gb {self.high_bytes / 2**30:g}")


class InFlight:
    """The producer's view of the pool: its keys not yet removed and their sizes."""

    def __init__(self, marks: Watermarks, exists: Callable[[list[str]], list[bool]],
                 ev: Emitter, poll_s: float = 0.02,
                 between: Callable[[], None] | None = None,
                 remove: Callable[[list[str]], None] | None = None) -> None:
        """`between` runs at every poll while waiting (the producer's look for a new plan; it
        may raise to abandon the wait); `remove` removes keys from the store (making room for
        a starved step, dropping what the trainer is done with)."""
        self.marks, self.exists, self.ev, self.poll_s = marks, exists, ev, poll_s
        self.between, self.remove = between, remove
        self.keys: dict[str, int] = {}
        self.steps: dict[str, int] = {}  # the plan step of each key (held-out keys have none)
        self.bytes = 0
        self.paused_s = 0.0
        self.pauses = 0
        self.peak = 0
        self.made_room = 0  # samples removed to make room for a starved step
        self._room_step: int | None = None

    def add(self, key: str, nbytes: int, step: int | None = None) -> None:
        self.keys[key] = nbytes
        if step is not None:
            self.steps[key] = step
        self.bytes += nbytes
        self.peak = max(self.peak, len(self.keys))

    def refresh(self) -> None:
        """Forget the keys the trainer has removed."""
        names = list(self.keys)
        for k, there in zip(names, self.exists(names), strict=True):
            if not there:
                self.bytes -= self.keys.pop(k)
                self.steps.pop(k, None)

    def _fits(self, nbytes: int) -> bool:
        return (len(self.keys) + 1 <= self.marks.high_samples
                and self.bytes + nbytes <= self.marks.high_bytes)

    def _low(self) -> bool:
        return len(self.keys) <= self.marks.low_samples and self.bytes <= self.marks.low_bytes

    def keep_only(self, steps: dict[str, int | None], remove: Callable[[list[str]], None]
                  ) -> None:
        """A new plan: its keys already in flight stay (with their new step numbers), the
        others are removed from the store."""
        self.refresh()
        stale = [k for k in self.keys if k not in steps]
        remove(stale)
        for k in stale:
            self.bytes -= self.keys.pop(k)
        self.steps = {k: s for k in self.keys if (s := steps[k]) is not None}

    def drop(self, keys: list[str]) -> None:
        """Remove `keys` from the store and the pool."""
        keys = [k for k in keys if k in self.keys]
        if self.remove is not None:
            self.remove(keys)
        for k in keys:
            self.bytes -= self.keys.pop(k)
            self.steps.pop(k, None)

    def drop_before(self, step: int) -> None:
        """The trainer is done with every step before `step`: what the pool still holds of them
        (put again by a producer restarted as the trainer acknowledged them) goes."""
        self.drop([k for k, s in self.steps.items() if s < step])

    def _make_room(self, nbytes: int, step: int) -> None:
        """Room for a put of starved step `step`: later steps' samples go, the latest first."""
        later = sorted((k for k, s in self.steps.items() if s > step),
                       key=lambda k: -self.steps[k])
        n = 0
        while later and not self._fits(nbytes):
            self.drop([later.pop(0)])
            n += 1
        self.made_room += n
        if n and step != self._room_step:  # said once a step: each of its puts may make room
            self._room_step = step
            self.ev.log(f"stream producer: removing samples of later steps to make room for "
                        f"step {step}, which the trainer waits for (they are put again later)")

    def _starved(self, step: int | None) -> bool:
        return step is not None and (not self.steps or step <= min(self.steps.values()))

    def wait_room(self, nbytes: int, what: str, step: int | None = None) -> None:
        """Return once a put of `nbytes` (of plan step `step`) may go ahead (module docstring)."""
        if nbytes > self.marks.high_bytes:
            raise EngineError(f"{what}: {nbytes} bytes is more than the pool's high watermark "
                              f"({self.marks.high_bytes} bytes); raise --high-gb")
        if self._fits(nbytes):
            return
        self.refresh()  # at high by what we knew: from here on, only low (or starving) will do
        if self.remove is not None and step is not None and self._starved(step):
            self._make_room(nbytes, step)
        if self._fits(nbytes) and (self._low() or self._starved(step)):
            return
        t0 = time.monotonic()
        self.pauses += 1
        self.ev.log(f"stream producer paused: pool at {len(self.keys)} samples, "
                    f"{self.bytes / 2**20:.1f} MiB (high watermark); waiting for the trainer")
        while not (self._fits(nbytes) and (self._low() or self._starved(step))):
            time.sleep(self.poll_s)
            if self.between is not None:
                self.between()
            self.refresh()
            if self.remove is not None and step is not None and self._starved(step):
                self._make_room(nbytes, step)
        dt = time.monotonic() - t0
        self.paused_s += dt
        self.ev.log(f"stream producer resumed after {dt:.2f} s: pool at {len(self.keys)} "
                    f"samples, {self.bytes / 2**20:.1f} MiB")

    def drain(self) -> None:
        """Wait until the trainer has removed every key put (the producer's memory holds them
        until then)."""
        while self.keys:
            time.sleep(self.poll_s)
            if self.between is not None:
                self.between()
            self.refresh()
