"""A target model's input embedding and lm_head, read from its weight files without loading the
model (offline training, `convert --embed-from`, `vocab remap --target`, the vLLM capture's final
norm): which tensors they are is engine/ckpt/key_map.py's target_heads, the one rule; a target that
ties its embeddings (config.json's tie_word_embeddings) uses the embedding as its lm_head.
Tensors are read through engine/ckpt/safetensors_io.py (safe_open; only the asked-for rows in
target_lm_head_rows).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from engine.ckpt.key_map import target_heads
from engine.ckpt.safetensors_io import Entry, WeightSet, open_weights
from engine.ckpt.target_config import read_config
from engine.ckpt.target_layout import resolve_layout
from engine.errors import EngineError
from engine.model.config import Eagle3Config


def target_tied(target: Path | str) -> bool | None:
    """config.json's tie_word_embeddings (text_config unwrapped; absent means false), or None
    for a weights-only directory without a config.json."""
    if not os.path.lexists(os.path.join(target, "config.json")):
        return None
    return bool(read_config(str(target), required=()).get("tie_word_embeddings", False))


def find_target_heads(target: Path | str, need_head: bool = True) -> tuple[WeightSet, str, str]:
    """The target's weights and the stored names of its embedding and lm_head (the same name
    for a tied target)."""
    ws = open_weights(Path(target))
    emb, head = target_heads(text_stack_names(target, list(ws.names())), target_tied(target),
                             str(target), need_head)
    return ws, emb, head


def text_stack_names(target: Path | str, names: list[str]) -> list[str]:
    """The names of the text stack's tensors: all of them for a causal LM (or a weights-only
    directory), a multimodal wrapper's `language_model` ones only (never its vision tower)."""
    if not os.path.lexists(os.path.join(target, "config.json")):
        return names
    layout = resolve_layout(str(target), names)
    return names if layout.wrapper is None else layout.text_names(names)


def target_embedding_entry(target: Path, cfg: Eagle3Config) -> tuple[WeightSet, Entry]:
    """Where the target's input embedding is, after checking it is [V, H] for this drafter."""
    ws, name, _ = find_target_heads(target, need_head=False)
    e = ws.entries[name]
    want = (cfg.vocab_size, cfg.hidden_size)
    if e.shape != want:
        raise EngineError(f"{e.file}: tensor {name!r} has shape {list(e.shape)} but the drafter "
                          f"needs {list(want)} = [vocab_size, hidden_size]")
    return ws, e


def load_target_embedding(target: Path, cfg: Eagle3Config) -> torch.Tensor:
    """The target model's input embedding [V, H], checked against the drafter's config."""
    ws, e = target_embedding_entry(target, cfg)
    return ws.load(e.name)


class TargetHead:
    """The target's lm_head [V,Ht] (float32, CPU), read only as far as a run needs it: training
    on data that stores the target's argmax needs only the draft-vocab rows (`rows`), 2% of a
    160k x 7168 head; the full matrix (`full`, read once, kept) only for data without it.
    `loaded` is the full matrix when the caller already holds it (a tied target's embedding, an
    in-process target's head)."""

    def __init__(self, target: Path | str, loaded: torch.Tensor | None = None) -> None:
        self.target = Path(target)
        self._full = loaded

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows `ids` [n] -> [n, Ht], without reading the others."""
        if self._full is not None:
            return self._full[ids].contiguous()
        return target_lm_head_rows(self.target, ids.cpu())[0].float()

    def full(self) -> torch.Tensor:
        if self._full is None:
            ws, _, name = find_target_heads(self.target)
            self._full = ws.load(name).float()
        return self._full


def load_embedding(target_dir: str) -> tuple[torch.Tensor, TargetHead]:
    """(embedding [V,Ht] float32, the lm_head as a TargetHead): reads only the embedding now;
    a tied target's head is that same tensor."""
    ws, emb_name, head_name = find_target_heads(target_dir)
    emb = ws.load(emb_name).float()
    return emb, TargetHead(target_dir, emb if head_name == emb_name else None)


def target_lm_head_rows(target: Path, rows: torch.Tensor, hidden: int | None = None
                        ) -> tuple[torch.Tensor, str]:
    """Rows of the target's lm_head (its embedding when tied), reading only those rows; with
    `hidden`, the rows must be that wide."""
    ws, _, name = find_target_heads(target)
    e = ws.entries[name]
    if hidden is not None and (len(e.shape) != 2 or e.shape[1] != hidden):  # else load_rows: 2-D
        raise EngineError(f"{e.file}: tensor {name!r} has shape {list(e.shape)}; the "
                          f"drafter's lm_head rows are {hidden} wide")
    if rows.numel() and int(rows.max()) >= e.shape[0]:
        raise EngineError(f"{e.file}: tensor {name!r} has {e.shape[0]} rows, the vocab "
                          f"needs id {int(rows.max())}")
    return ws.load_rows(name, rows), f"{e.file.name}:{name}"
