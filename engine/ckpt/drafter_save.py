"""Writing a drafter: its config file in a style, provenance.json (one builder for save and
convert), and save_drafter, a whole canonical state dict saved atomically
(engine/ckpt/output_dir.py: temp dir + rename). Streaming conversion is engine/ckpt/converter.py.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from engine import __version__
from engine.ckpt.checks import expected_tensors, export_checks
from engine.ckpt.config_styles import to_eagle_dict, to_speculators_dict
from engine.ckpt.key_map import IGNORED_SUFFIXES, from_canonical, output_style
from engine.ckpt.output_dir import atomic_output_dir
from engine.ckpt.safetensors_io import FLOAT_CODES, save_tensors, torch_dtype
from engine.errors import EngineError
from engine.fileio import json_text
from engine.model.config import Eagle3Config


def config_for(cfg: Eagle3Config, to: str, verifier: str | None = None,
               speculative_tokens: int | None = None) -> dict[str, Any]:
    if output_style(to) == "speculators":
        return to_speculators_dict(cfg, verifier=verifier,
                                   speculative_tokens=speculative_tokens)
    return to_eagle_dict(cfg)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """A JSON file inside an output's temp dir (the directory as a whole is atomic)."""
    path.write_text(json_text(data), encoding="utf-8")


def build_provenance(to: str, sections: Mapping[str, Any], command: bool = False
                     ) -> dict[str, Any]:
    """provenance.json, for save_drafter and convert alike: engine version, time, (the command
    line,) the output format, then the caller's sections."""
    head: dict[str, Any] = {"engine_version": __version__,
                            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if command:
        head["command"] = " ".join([os.path.basename(sys.executable), "-m", "engine",
                                    *sys.argv[1:]])
    return {**head, "format": to, **sections}


def identity_vocab_map(cfg: Eagle3Config, name: str) -> bool:
    """`d2t`/`t2d` of a drafter whose draft vocab is the target's: the identity map, which no
    export carries. vLLM's EAGLE-3 models have no `draft_id_to_target_id` parameter when
    draft_vocab_size == vocab_size and refuse to load a `d2t` then (llama_eagle3.py,
    deepseek_eagle3.py); every reader here takes a missing map as the identity."""
    return name in ("d2t", "t2d") and not cfg.has_vocab_map


def save_drafter(dst: Path, cfg: Eagle3Config, state_dict: Mapping[str, torch.Tensor],
                 to: str = "eagle", *, include_embed: bool = True, force: bool = False,
                 verifier: str | None = None, speculative_tokens: int | None = None,
                 provenance: dict[str, Any] | None = None) -> list[str]:
    """Save a canonical state dict in a style, atomically. Returns export warnings."""
    sections = provenance
    sd = {k: v for k, v in state_dict.items()
          if (include_embed or k != "embed_tokens.weight") and not k.endswith(IGNORED_SUFFIXES)
          and not identity_vocab_map(cfg, k)}
    exp = expected_tensors(cfg)
    for k, v in sd.items():
        if k not in exp:
            raise EngineError(f"save: unknown tensor {k!r}")
        if tuple(v.shape) != exp[k].shape:
            raise EngineError(f"save: tensor {k!r} has shape {list(v.shape)}, config says "
                              f"{list(exp[k].shape)} = {exp[k].formula}")
    if verifier:
        cfg = cfg.with_(verifier=verifier)
    warnings = export_checks(cfg, list(sd), to)
    style = output_style(to)
    names = {k: from_canonical(k, style) for k in sd}
    conf = config_for(cfg, to, verifier, speculative_tokens)
    with atomic_output_dir(Path(dst), force=force) as tmp:
        save_tensors(tmp / "model.safetensors", {names[k]: v for k, v in sd.items()})
        write_json(tmp / "config.json", conf)
        if sections is not None or (cfg.norm_output and style == "eagle"):
            # a flat config's `norm_output` is read by who wrote it (SpecForge means another
            # thing by it): this record says it was us, in the speculators/vLLM meaning, even
            # for a bare save
            write_json(tmp / "provenance.json", build_provenance(to, sections or {}))
    return warnings


def cast_code(code: str, dtype: str) -> str:
    """The stored dtype after `--dtype` (only floating tensors change)."""
    if dtype == "keep" or code not in FLOAT_CODES:
        return code
    return {"bf16": "BF16", "fp16": "F16", "fp32": "F32"}[dtype]


def torch_name(code: str) -> str:
    return str(torch_dtype(code)).replace("torch.", "")
