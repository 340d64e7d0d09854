"""A target's config.json, read without torch (so printing a command line or checking a
config stays fast on a host whose torch takes seconds to import)."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from engine.errors import EngineError
from engine.fileio import nonfinite_field, read_json


def read_config(target_dir: str,
                required: tuple[str, ...] = ("hidden_size", "num_hidden_layers", "vocab_size")
                ) -> dict[str, Any]:
    """The target's config.json as a dict (text_config unwrapped for multimodal wrappers); each
    `required` field must be an integer, and no field NaN or Infinity (Python's json reads them,
    and a NaN rms_norm_eps or rope_theta copied into a drafter would train NaN silently)."""
    path = os.path.join(target_dir, "config.json")
    cfg = read_json(path, missing="no such file (is --target a model directory?)")
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg, **cfg["text_config"]}
    if (bad := nonfinite_field(cfg)) is not None:
        raise EngineError(f"{path}: field {bad!r}: not a finite number (NaN or Infinity)")
    for key in required:
        if not isinstance(cfg.get(key), int):
            raise EngineError(f"{path}: field {key!r}: missing or not an integer")
    return dict(cfg)


def config_dtype(cfg: dict[str, Any]) -> str | None:
    """The dtype a config names (`torch_dtype`, or `dtype` from transformers 5 on), as torch
    spells it (`bfloat16`); None when it names none."""
    value = cfg.get("torch_dtype") or cfg.get("dtype")
    return str(value).replace("torch.", "") if value else None


def config_hash(target_dir: str) -> str:
    """sha256 of the target's config.json as canonical JSON (ties data to the target)."""
    cfg = read_config(target_dir)
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()
