"""A streamed run's figures, from its events: the producer's pool and pauses, the trainer's
waits and tokens per second, parsed once into frozen records and turned into the series the
run detail draws (console/widgets/line_plot.py StreamCharts).

The engine names the metric events (engine/stream/producer.py, engine/stream/stream_data.py):

    stream producer   pool_samples, pool_bytes, produced, tokens, paused_s, put_s  (totals)
    stream trainer    wait_s, waits, read_s, ack_s                          (running totals)

and a training step's own metric carries `tokens_per_s`. Totals become rates between two
figures: tokens put per second (beside the trainer's tokens/s), and the share of the time the
producer was paused or the trainer waited (0 to 1): the side that waits is the faster one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from engine import events

PRODUCER = "stream producer"
TRAINER = "stream trainer"
#: figures kept per side (a producer reports every 64 samples, a trainer every step)
MAX_FIGURES = 2000
MIB = float(1 << 20)

Points = list[tuple[float, float]]


def _num(values: Mapping[str, float | int | None], key: str) -> float | None:
    v = values.get(key)
    return float(v) if v is not None else None


@dataclass(frozen=True)
class ProducerFigures:
    """One `stream producer` metric: the pool now, and the totals so far."""

    t: float
    pool_samples: float | None
    pool_bytes: float | None
    produced: float | None
    tokens: float | None
    paused_s: float | None
    put_s: float | None

    @classmethod
    def of(cls, ev: events.Metric) -> ProducerFigures:
        v = ev.values
        return cls(ev.t, _num(v, "pool_samples"), _num(v, "pool_bytes"), _num(v, "produced"),
                   _num(v, "tokens"), _num(v, "paused_s"), _num(v, "put_s"))


@dataclass(frozen=True)
class TrainerFigures:
    """One `stream trainer` metric (rank 0's): its waiting and reading totals at a step."""

    t: float
    step: int | None
    wait_s: float | None
    waits: float | None
    read_s: float | None
    ack_s: float | None

    @classmethod
    def of(cls, ev: events.Metric) -> TrainerFigures:
        v = ev.values
        return cls(ev.t, ev.step, _num(v, "wait_s"), _num(v, "waits"), _num(v, "read_s"),
                   _num(v, "ack_s"))


def _rate(points: list[tuple[float, float | None]], t0: float, share: bool = False) -> Points:
    """(seconds since t0, change per second) between consecutive totals; share: capped at
    1 (a share of the time)."""
    out: Points = []
    known = [(t, v) for t, v in points if v is not None]
    for (ta, va), (tb, vb) in zip(known, known[1:], strict=False):
        if tb > ta and va is not None and vb is not None and vb >= va:
            r = (vb - va) / (tb - ta)
            out.append((tb - t0, min(r, 1.0) if share else r))
    return out


class StreamFigures:
    """What one run's events said of the stream (module docstring); no I/O."""

    def __init__(self) -> None:
        self.producer: deque[ProducerFigures] = deque(maxlen=MAX_FIGURES)
        self.trainer: deque[TrainerFigures] = deque(maxlen=MAX_FIGURES)
        self.tokens: deque[tuple[float, float]] = deque(maxlen=MAX_FIGURES)

    def ingest(self, ev: events.Metric) -> bool:
        """Keep a stream metric (True), or a training step's tokens per second (False: the
        step's numbers are the caller's too)."""
        if ev.name == PRODUCER:
            self.producer.append(ProducerFigures.of(ev))
            return True
        if ev.name == TRAINER:
            self.trainer.append(TrainerFigures.of(ev))
            return True
        if not ev.name:
            tps = _num(ev.values, "tokens_per_s")
            if tps is not None:
                self.tokens.append((ev.t, tps))
        return False

    @property
    def streamed(self) -> bool:
        """Whether the run said anything of a stream."""
        return bool(self.producer or self.trainer)

    def first_t(self) -> float | None:
        ts = [x[0].t for x in (self.producer, self.trainer) if x]
        return min(ts) if ts else None

    # -- series, x in seconds since t0 ----------------------------------------------------------
    def produced_rate(self, t0: float) -> Points:
        """The producer's tokens put per second."""
        return _rate([(f.t, f.tokens) for f in self.producer], t0)

    def tokens_rate(self, t0: float) -> Points:
        return [(t - t0, v) for t, v in self.tokens if t >= t0]

    def pool_samples(self, t0: float) -> Points:
        return [(f.t - t0, f.pool_samples) for f in self.producer if f.pool_samples is not None]

    def pool_mib(self, t0: float) -> Points:
        return [(f.t - t0, f.pool_bytes / MIB) for f in self.producer
                if f.pool_bytes is not None]

    def paused_share(self, t0: float) -> Points:
        return _rate([(f.t, f.paused_s) for f in self.producer], t0, share=True)

    def wait_share(self, t0: float) -> Points:
        return _rate([(f.t, f.wait_s) for f in self.trainer], t0, share=True)
