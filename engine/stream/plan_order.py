"""The order in which the trainer will read samples, put by its rank 0 under RUN/plan: the
held-out samples, then every step of the batch plan (engine/training/plan.py) from the
trainer's position on: its epoch and its sample indices, all ranks' micro-batches together.
The producer puts samples in exactly this order, so the pool never holds a sample the trainer
will not want soon, and the step boundaries tell it when the trainer starves
(engine/stream/pool.py). `start` is the trainer's step when it wrote the plan and `nonce` names
the writing: a resumed trainer writes a new plan, and the producer starts over from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from engine.errors import EngineError


@dataclass(frozen=True)
class PlanOrder:
    start: int
    nonce: str
    held: tuple[int, ...]
    steps: tuple[tuple[int, tuple[int, ...]], ...]  # (epoch, sample indices)


def encode(p: PlanOrder) -> bytes:
    return json.dumps({"start": p.start, "nonce": p.nonce, "held": list(p.held),
                       "steps": [[e, list(idx)] for e, idx in p.steps]},
                      separators=(",", ":")).encode()


def decode(raw: bytes, key: str, samples: int) -> PlanOrder:
    try:
        d = json.loads(raw)
        start, nonce, held = int(d["start"]), str(d["nonce"]), tuple(int(i) for i in d["held"])
        steps = tuple((int(e), tuple(int(i) for i in idx)) for e, idx in d["steps"])
    except (ValueError, KeyError, TypeError) as e:
        raise EngineError(f"stream plan {key}: unreadable ({type(e).__name__}: {e})") from None
    bad = [i for i in held + tuple(i for _, idx in steps for i in idx) if not 0 <= i < samples]
    if bad:
        raise EngineError(f"stream plan {key}: sample {bad[0]} is outside the manifest's "
                          f"{samples} samples")
    return PlanOrder(start, nonce, held, steps)
