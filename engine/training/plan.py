"""The deterministic batch plan: which samples every rank trains on at every step.

Per epoch e, the training sample indices are shuffled with a generator seeded by (seed, e), then cut
in order into micro-batches whose padded size (longest sample x count) stays within `batch_tokens`,
or, packed, whose summed length does (one packed row; a longer sample alone). Consecutive groups of
`world_size * grad_accum` micro-batches form one optimizer step; rank r takes micro-batch `a *
world_size + r` at accumulation index a. An incomplete trailing group is dropped. The plan depends
only on lengths, the seed and these sizes, so a resumed run (or another rank) recomputes it exactly
and the data position is just (epoch, step in epoch).

A single process with grad_accum = W * A and W ranks with grad_accum = A see the same global
batches, which is what makes the torchrun comparison possible.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Step:
    """One optimizer step: its micro-batches (lists of sample indices) across all ranks."""

    epoch: int
    index: int  # step number within the epoch, from 0
    micro: tuple[tuple[int, ...], ...]

    def for_rank(self, rank: int, world: int) -> list[tuple[int, ...]]:
        """This rank's micro-batches, in accumulation order."""
        return [self.micro[a * world + rank] for a in range(len(self.micro) // world)]

    def samples(self) -> list[int]:
        return [i for m in self.micro for i in m]


def micro_batches(order: list[int], lengths: list[int], batch_tokens: int, packed: bool = False
                  ) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    cur: list[int] = []
    longest = total = 0
    for i in order:
        n = lengths[i]
        size = total + n if packed else max(longest, n) * (len(cur) + 1)
        if cur and size > batch_tokens:
            out.append(tuple(cur))
            cur, longest, total = [], 0, 0
        cur.append(i)
        longest = max(longest, n)
        total += n
    if cur:
        out.append(tuple(cur))
    return out


def epoch_steps(indices: list[int], lengths: list[int], batch_tokens: int, group: int,
                seed: int, epoch: int, packed: bool = False) -> list[Step]:
    """The steps of one epoch over `indices` (module docstring)."""
    gen = torch.Generator().manual_seed(seed * 100003 + epoch)
    perm = torch.randperm(len(indices), generator=gen).tolist()
    micro = micro_batches([indices[p] for p in perm], lengths, batch_tokens, packed)
    n = len(micro) // group
    return [Step(epoch, s, tuple(micro[s * group:(s + 1) * group])) for s in range(n)]


def steps_ahead(epoch: Callable[[int], list[Step]], pos: tuple[int, int], left: int,
                epochs: int) -> list[Step]:
    """The next `left` steps from position (epoch, step in epoch), across epochs."""
    steps: list[Step] = []
    e, start = pos
    while len(steps) < left and e < epochs:
        steps += epoch(e)[start:start + left - len(steps)]
        e, start = e + 1, 0
    return steps


def split_holdout(n: int, holdout: int, seed: int = 12345) -> tuple[list[int], list[int]]:
    """(train indices, held-out indices): a fixed random `holdout` samples kept out of training."""
    if holdout <= 0:
        return list(range(n)), []
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    return sorted(perm[holdout:]), sorted(perm[:holdout])
