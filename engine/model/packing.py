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
