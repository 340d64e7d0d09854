"""Packed rows: several samples side by side in one row, told apart by segment ids [B,T] (one id
per sample, padding an id of its own). Each sample attends only to itself (block-diagonal
attention), its positions restart at 0, and a loss position counts only when the token it
predicts lies in the same sample, so every sample's loss and gradient are what they are on its
own row.

The TTT shift reads token t+1+i at step i: at a sample's last 1+i positions that token is the
next sample's, but those positions are never supervised (`same_segment`) and only the sample's
own later positions could see them, which the causal mask hides.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def segment_positions(segments: Tensor) -> Tensor:
    """Positions restarting at 0 at each new segment id along dim 1: [B,T] int64."""
    b, t = segments.shape
    idx = torch.arange(t, device=segments.device).expand(b, t)
    new = torch.ones_like(segments, dtype=torch.bool)
    new[:, 1:] = segments[:, 1:] != segments[:, :-1]
    start = torch.cummax(torch.where(new, idx, torch.zeros_like(idx)), dim=1).values
    return idx - start


def same_segment(segments: Tensor, n: int) -> Tensor:
    """Bool [B,T]: position t+n exists and is in position t's segment."""
    t = segments.shape[1]
    out = torch.zeros_like(segments, dtype=torch.bool)
    if n < t:
        out[:, :t - n] = segments[:, n:] == segments[:, :t - n]
    return out


def block_diagonal(segments: Tensor) -> Tensor:
    """Bool [B,1,T,T]: query t may see key s when both are in one segment."""
    return (segments[:, :, None] == segments[:, None, :])[:, None]


@dataclass(frozen=True)
class Spans:
    """Where each sample of packed rows lies: (row, start, end) per segment, in order, covering
    every position. The TTT attention runs its causal step-0 block once per span (no [T,T]
    mask, so a row of 16k tokens costs what its samples cost apart); the later steps' keys are
    at the query's own position and need nothing."""

    items: tuple[tuple[int, int, int], ...]


def segment_spans(segments: Tensor) -> Spans:
    """The Spans of segment ids [B,T] (a new span wherever the id changes along a row)."""
    b, t = segments.shape
    change = torch.ones_like(segments, dtype=torch.bool)
    change[:, 1:] = segments[:, 1:] != segments[:, :-1]
    out: list[tuple[int, int, int]] = []
    for r, starts in enumerate(change.cpu().tolist()):
        cuts = [i for i, c in enumerate(starts) if c] + [t]
        out.extend((r, a, z) for a, z in zip(cuts, cuts[1:], strict=False))
    return Spans(tuple(out))
