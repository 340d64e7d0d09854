"""Test helpers: real drafter checkpoints on disk, written with the safetensors library itself."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.ckpt.key_map import from_canonical
from engine.model.draft import Eagle3Config, Eagle3Draft, preset


def tiny_config(**changes: object) -> Eagle3Config:
    return preset("tiny").with_(**changes)


def random_state(cfg: Eagle3Config, seed: int = 0, embed: bool = False,
                 dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """A canonical state dict with random weights and a non-trivial vocab map."""
    torch.manual_seed(seed)
    m = Eagle3Draft(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_()
    vd, v = cfg.draft_vocab_size, cfg.vocab_size
    assert vd is not None
    ids = torch.randperm(v)[:vd].sort().values  # a sorted subset of the target vocab
    m.d2t.copy_(ids - torch.arange(vd))
    m.t2d.zero_()
    m.t2d[ids] = True
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    if not embed:
        del sd["embed_tokens.weight"]
    return {k: (t.to(dtype) if t.is_floating_point() else t) for k, t in sd.items()}


def write_drafter(d: Path, cfg: Eagle3Config | None = None, style: str = "eagle",
                  state: dict[str, torch.Tensor] | None = None, layout: str = "single",
                  seed: int = 0, embed: bool = False) -> dict[str, torch.Tensor]:
    """Write a drafter dir in `style` with `layout` single | sharded | bin; returns its state."""
    cfg = cfg or tiny_config()
    state = state if state is not None else random_state(cfg, seed, embed)
    d.mkdir(parents=True, exist_ok=True)
    stored = {from_canonical(k, style): v.contiguous() for k, v in state.items()}
    conf = cfg.to_speculators_dict(verifier="tiny/target") if style == "speculators" \
        else cfg.to_eagle_dict()
    (d / "config.json").write_text(json.dumps(conf, indent=2))
    if layout == "single":
        save_file(stored, str(d / "model.safetensors"), metadata={"format": "pt"})
    elif layout == "sharded":
        names = sorted(stored)
        shards = [names[0::2], names[1::2]]
        wmap = {}
        for i, part in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-00002.safetensors"
            save_file({k: stored[k] for k in part}, str(d / fname), metadata={"format": "pt"})
            wmap.update({k: fname for k in part})
        (d / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": wmap}))
    elif layout == "bin":
        torch.save(stored, d / "pytorch_model.bin")
    else:
        raise ValueError(layout)
    return state


def write_target_embedding(d: Path, cfg: Eagle3Config, seed: int = 7) -> torch.Tensor:
    """A stand-in target directory holding model.embed_tokens.weight [V, H] (and a layer)."""
    torch.manual_seed(seed)
    emb = torch.randn(cfg.vocab_size, cfg.hidden_size, dtype=torch.bfloat16)
    d.mkdir(parents=True, exist_ok=True)
    save_file({"model.embed_tokens.weight": emb,
               "model.norm.weight": torch.ones(cfg.hidden_size, dtype=torch.bfloat16)},
              str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"model_type": "llama",
                                               "vocab_size": cfg.vocab_size}))
    return emb
