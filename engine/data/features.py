"""What every training-data reader returns: a Sample per conversation and the FeatureData list
they come in, with lengths and supervised counts known up front (so batch plans need no tensor
reads), and `collate`, the padded batch the trainer consumes (`collate_packed`: one packed
row). The readers: engine/data/readers.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

#: a data directory's manifest names this format (engine/data/prepare.py writes it)
FORMAT = "eagle3-console-data"
SHARD_KEYS = ("input_ids", "loss_mask", "offsets", "aux_hidden_states", "hidden_states")

@dataclass
class Sample:
    """One conversation's features: ids/mask [T], aux [T,3Ht], hidden [T,Ht] (final-norm), and
    the target's argmax [T] when the data stores it (prepare's optional `target_argmax`)."""

    input_ids: Tensor
    loss_mask: Tensor
    aux: Tensor
    hidden: Tensor
    target_argmax: Tensor | None = None


class FeatureData:
    """A random-access list of Samples with known lengths."""

    path: str
    lengths: list[int]
    loss_counts: list[int]
    """per sample: assistant tokens that step 0 predicts (loss_mask[2:].sum())."""
    hidden_size: int
    aux_layer_ids: list[int] | None
    meta: dict[str, Any]
    has_target_argmax: bool = False
    """Whether batches carry the target's argmax (`target_argmax`), else training computes it."""

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> Sample:
        raise NotImplementedError

    def token_counts(self, vocab_size: int) -> Tensor:
        """int64 [V]: how often each token id occurs where the loss mask is 1."""
        raise NotImplementedError

    def batch(self, indices: tuple[int, ...] | list[int]) -> dict[str, Tensor]:
        """A padded batch of these samples (see `collate`)."""
        return collate([self[i] for i in indices])

    def packed(self, indices: tuple[int, ...] | list[int]) -> dict[str, Tensor]:
        """These samples side by side in one row (see `collate_packed`)."""
        return collate_packed([self[i] for i in indices])

    def describe(self, i: int) -> str:
        """Where sample i comes from, for error messages (a reader may name its file)."""
        return f"sample {i}"

    def tokens(self, i: int) -> tuple[Tensor, Tensor]:
        """Sample i's input_ids and loss_mask only (no hidden states read)."""
        s = self[i]
        return s.input_ids, s.loss_mask


def collate(samples: list[Sample]) -> dict[str, Tensor]:
    """Right-padded batch: input_ids/loss_mask/attention_mask [B,T], aux [B,T,3Ht], hidden, and
    target_argmax [B,T] (0 on padding) when every sample has one."""
    width = max(s.input_ids.numel() for s in samples)
    b = len(samples)
    ht = samples[0].hidden.shape[-1]
    out = {
        "input_ids": torch.zeros(b, width, dtype=torch.long),
        "loss_mask": torch.zeros(b, width, dtype=torch.long),
        "attention_mask": torch.zeros(b, width, dtype=torch.long),
        "aux": torch.zeros(b, width, 3 * ht, dtype=samples[0].aux.dtype),
        "hidden": torch.zeros(b, width, ht, dtype=samples[0].hidden.dtype),
    }
    for r, s in enumerate(samples):
        n = s.input_ids.numel()
        out["input_ids"][r, :n] = s.input_ids
        out["loss_mask"][r, :n] = s.loss_mask
        out["attention_mask"][r, :n] = 1
        out["aux"][r, :n] = s.aux
        out["hidden"][r, :n] = s.hidden
    if all(s.target_argmax is not None for s in samples):
        top = out["target_argmax"] = torch.zeros(b, width, dtype=torch.long)
        for r, s in enumerate(samples):
            top[r, :s.input_ids.numel()] = s.target_argmax  # type: ignore[assignment]
    return out


def collate_packed(samples: list[Sample]) -> dict[str, Tensor]:
    """The samples concatenated into one row [1, sum T]: the keys of `collate` (attention_mask
    all 1) and `segments` [1, sum T], sample r's positions holding r (engine/model/packing.py)."""
    out = {k: torch.cat([getattr(s, k) for s in samples])[None]
           for k in ("input_ids", "loss_mask", "aux", "hidden")}
    out["input_ids"], out["loss_mask"] = out["input_ids"].long(), out["loss_mask"].long()
    out["attention_mask"] = torch.ones_like(out["input_ids"])
    out["segments"] = torch.cat([torch.full((s.input_ids.numel(),), r, dtype=torch.long)
                                 for r, s in enumerate(samples)])[None]
    if all(s.target_argmax is not None for s in samples):
        out["target_argmax"] = torch.cat([s.target_argmax for s in samples  # type: ignore[misc]
                                          ]).long()[None]
    return out
