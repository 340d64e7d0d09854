"""A drafter checkpoint directory opened for reading: config.json, the weight index and the
detected style; nothing but what a caller asks for is loaded (inspect loads only d2t/t2d).

    read_config(dir) -> (dict, Eagle3Config)   errors name the file and the field
    open_checkpoint(dir) -> Checkpoint          canonical name -> stored name, via
    engine/ckpt/key_map.py
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.ckpt.config_styles import NORM_OUTPUT_ENV, config_from_dict
from engine.ckpt.key_map import IGNORED_SUFFIXES, Detected, detect, to_canonical
from engine.ckpt.safetensors_io import Entry, WeightSet, open_weights
from engine.errors import EngineError
from engine.fileio import read_json
from engine.model.config import Eagle3Config


def norm_output_meaning(d: Path) -> str | None:
    """Who wrote a flat config's `norm_output` (speculators/vLLM and SpecForge mean different
    things by it): what NORM_OUTPUT_ENV says, else "speculators" for this engine's own exports (a
    provenance.json with our engine_version: we write the key only in that meaning), else None
    (unknown: a config carrying it is refused)."""
    env = os.environ.get(NORM_OUTPUT_ENV)
    if env:
        return env
    prov = d / "provenance.json"
    if prov.is_file():
        try:
            doc = json.loads(prov.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if isinstance(doc, dict) and "engine_version" in doc and "format" in doc:
            return "speculators"
    return None


def read_config(d: Path) -> tuple[dict[str, Any], Eagle3Config]:
    """config.json as a dict and as a validated Eagle3Config (errors name the file and field)."""
    path = d / "config.json"
    data = read_json(path, missing="missing")  # never blocks on a FIFO
    try:
        meaning = norm_output_meaning(d) if isinstance(data, dict) and "norm_output" in data \
            else None
        return data, config_from_dict(data, norm_output_meaning=meaning)
    except EngineError as e:
        raise EngineError(f"{path}: {e}") from None


@dataclass
class Checkpoint:
    """A drafter directory opened for reading: nothing but d2t/t2d is ever loaded eagerly."""

    path: Path
    config_dict: dict[str, Any]
    config: Eagle3Config
    detected: Detected
    weights: WeightSet
    stored: dict[str, str]  # canonical name -> stored name (ignored buffers left out)
    ignored: list[str] = field(default_factory=list)

    def entry(self, canonical: str) -> Entry:
        return self.weights.entries[self.stored[canonical]]

    def load(self, canonical: str) -> torch.Tensor:
        return self.weights.load(self.stored[canonical])

    def where(self, canonical: str | None = None) -> str:
        """The file a tensor lives in (or the weight file for a missing one)."""
        if canonical is not None and canonical in self.stored:
            return str(self.entry(canonical).file)
        return str(self.weights.files[0]) if len(self.weights.files) == 1 else str(
            self.path / "model.safetensors.index.json")


def open_checkpoint(d: Path) -> Checkpoint:
    d = Path(d)
    weights = open_weights(d)
    config_dict, cfg = read_config(d)
    names = weights.names()
    det = detect(names, config_dict, str(d))
    stored: dict[str, str] = {}
    ignored: list[str] = []
    for n in names:
        if n.endswith(IGNORED_SUFFIXES):
            ignored.append(n)
            continue
        stored[to_canonical(n, det.key_style)] = n
    # Optional fc norms are recognised by their tensors even when the config is silent.
    changes = {}
    if "input_norm.weight" in stored and not cfg.norm_before_fc:
        changes["norm_before_fc"] = True
    if "fc_norm.0.weight" in stored and not cfg.fc_norm:
        changes["fc_norm"] = True
    if changes:
        cfg = cfg.with_(**changes)
    return Checkpoint(d, config_dict, cfg, det, weights, stored, ignored)
