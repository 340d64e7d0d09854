"""The target's final norm, applied outside the target (the vLLM capture path).

vLLM's hidden-state extraction returns the last decoder layer's OUTPUT before the final norm (layer
id num_hidden_layers), while a data directory stores the final hidden state AFTER it (the lm_head
input). The engine applies the norm itself: only the norm's weight is read from the target's
weight files (engine/ckpt/safetensors_io.py, one tensor; never the whole model), and the arithmetic
is the transformers RMSNorm's, so the result matches the transformers path to float tolerance:
    x32 = x.float();  y = x32 * rsqrt(mean(x32^2) + eps);  out = w.to(x.dtype) * y.to(x.dtype)
Gemma-style targets scale by (1 + w) in float32 instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from engine.errors import EngineError

_NORM_KEY = re.compile(r"(^|\.)norm\.weight$")


def norm_key(names: list[str], where: str) -> str:
    """The final norm's tensor name among the target's weight names."""
    cands = [k for k in names if _NORM_KEY.search(k) and ".layers." not in k
             and not k.startswith(("mtp.", "model.mtp."))]
    if not cands:
        raise EngineError(f"{where}: no final norm tensor ('model.norm.weight' or "
                          "'*.norm.weight' outside the decoder layers) in the weights")
    # a multimodal wrapper's text stack first, then the plain 'model.norm.weight', then shortest
    return sorted(cands, key=lambda k: ("language_model" not in k,
                                        not k.startswith("model.norm"), len(k), k))[0]


@dataclass
class FinalNorm:
    """RMSNorm weight [Ht], its epsilon, and whether the scale is (1 + w) (Gemma)."""

    weight: Tensor
    eps: float
    plus_one: bool = False

    def __call__(self, x: Tensor) -> Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.plus_one:
            return (y * (1.0 + self.weight.float())).to(x.dtype)
        return self.weight.to(x.dtype) * y.to(x.dtype)


def load_final_norm(target_dir: str, cfg: dict[str, Any]) -> FinalNorm:
    """Read only the final norm's weight (and eps from config.json)."""
    from engine.ckpt.safetensors_io import open_weights
    from engine.ckpt.target_weights import text_stack_names
    ws = open_weights(Path(target_dir))
    key = norm_key(sorted(text_stack_names(target_dir, list(ws.names()))), target_dir)
    weight = ws.load(key)
    hidden = int(cfg["hidden_size"])
    if tuple(weight.shape) != (hidden,):
        raise EngineError(f"{ws.entries[key].file}: tensor {key!r} has shape {list(weight.shape)}, "
                          f"expected [{hidden}] (hidden_size)")
    eps = cfg.get("rms_norm_eps", cfg.get("layer_norm_epsilon", cfg.get("layer_norm_eps", 1e-6)))
    plus_one = str(cfg.get("model_type", "")).startswith("gemma")
    return FinalNorm(weight=weight, eps=float(eps), plus_one=plus_one)
