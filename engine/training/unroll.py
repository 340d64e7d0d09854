"""The module DDP and FSDP wrap: the TTT unroll and its loss in one `forward`.

The loss applies the drafter's lm_head itself (engine/model/fused_ce.py), so it runs inside the
forward, where FSDP has the weight gathered and DDP's hooks see its gradient.
"""

from __future__ import annotations

from torch import Tensor, nn

from engine.model.draft import Eagle3Draft
from engine.model.ttt_loss import TargetSide, ttt_loss_fused


class Unroll(nn.Module):
    """forward -> (loss, stats) of `ttt_loss_fused` for one micro-batch (`segments`: packed
    rows, engine/model/packing.py)."""

    def __init__(self, draft: Eagle3Draft, steps: int) -> None:
        super().__init__()
        self.draft = draft
        self.steps = steps

    def forward(self, aux: Tensor, ids: Tensor, att: Tensor, rows: list[Tensor],
                target: TargetSide, loss_mask: Tensor, denom: float,
                segments: Tensor | None = None) -> tuple[Tensor, Tensor]:
        states = self.draft.ttt_forward(aux, ids, self.steps, attention_mask=att, rows=rows,
                                        head=False, segments=segments)
        return ttt_loss_fused(states, self.draft.lm_head.weight, target, loss_mask,
                              self.draft.d2t, denom, rows, segments=segments)
