"""Training data in: prepared shard directories (engine/data/prepare.py) and SpecForge offline
files.

`open_data(path)` returns a FeatureData whatever the layout:
- a directory with manifest.json: our safetensors shards (format in engine/data/prepare.py);
- a directory of SpecForge `data_<i>.ckpt` files (one torch.save'd dict per sample, read with
  `weights_only=True` and mmap: `input_ids` [T], `loss_mask` [T], `hidden_state` [1,T,Ht] after the
  target's final norm, `aux_hidden_state` [1,T,3Ht]); leading batch dims of 1 are accepted;
- a speculators offline directory: its preprocessed Arrow rows (input_ids, loss_mask) beside
  `hidden_states/hs_<i>.safetensors` (engine/data/speculators.py documents the layout).

Every sample comes back as a Sample (engine/data/features.py: CPU tensors, token axis first).
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any

import torch
from torch import Tensor

from engine.data.features import FORMAT, SHARD_KEYS, FeatureData, Sample
from engine.data.fp8_store import read_states
from engine.data.shard_checks import (
    INT_KEYS,
    check_count,
    check_shard,
    feature_dtypes,
    manifest_files,
    manifest_vocab_size,
)
from engine.data.speculators import SpeculatorsData, find_layout
from engine.errors import EngineError
from engine.fileio import read_json


class ShardData(FeatureData):
    """Our prepared format: manifest.json + shard_NNNNN.safetensors, checked once on opening
    (engine/data/shard_checks.py); `vocab_size` (the target's) bounds the token ids."""

    def __init__(self, path: str, vocab_size: int | None = None) -> None:
        self.path = path
        mpath = os.path.join(path, "manifest.json")
        meta = read_json(mpath, obj=False)
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise EngineError(f"{mpath}: field 'format': expected {FORMAT!r}")
        if meta.get("version") != 1:
            raise EngineError(f"{mpath}: field 'version': {meta.get('version')!r} is not supported")
        files = manifest_files(meta, mpath)
        self.meta = meta
        # FP8 shards dequantise to the dtype the target computed in (engine/data/fp8_store.py)
        self.dtype = getattr(torch, str(meta.get("dtype", "float32")), torch.float32)
        self.aux_layer_ids = meta.get("aux_layer_ids")
        self.hidden_size = int(meta.get("target", {}).get("hidden_size", 0))
        self.vocab_size = vocab_size or manifest_vocab_size(meta, mpath)
        self._index: list[tuple[str, int, int]] = []  # (file, start, end)
        self._local: list[int] = []  # the sample's number inside its shard
        self.has_target_argmax = True  # every shard holds `target_argmax`
        self._ids: list[Tensor] = []
        self._mask: list[Tensor] = []
        self.lengths, self.loss_counts = [], []
        for i, (entry, name) in enumerate(zip(meta["shards"], files, strict=True)):
            fpath = os.path.join(path, name)
            if not os.path.isfile(fpath):
                raise EngineError(f"{mpath}: shard {name!r} is missing")
            ints, hs = self._read_shard(fpath)
            ids, mask, off = ints["input_ids"], ints["loss_mask"], ints["offsets"]
            self.has_target_argmax = self.has_target_argmax and "target_argmax" in ints
            check_count(mpath, f"shards[{i}].samples",
                        entry.get("samples"), off.numel() - 1, f"{name} holds")
            self.hidden_size = self.hidden_size or hs
            for k, (a, b) in enumerate(zip(off[:-1].tolist(), off[1:].tolist(), strict=False)):
                self._index.append((fpath, a, b))
                self._local.append(k)
                self._ids.append(ids[a:b])
                self._mask.append(mask[a:b])
                self.lengths.append(b - a)
                self.loss_counts.append(int(mask[a:b][2:].sum()))
        check_count(mpath, "samples", meta.get("samples"), len(self.lengths),
                    "its shards hold")

    def _read_shard(self, fpath: str) -> tuple[dict[str, Tensor], int]:
        """A shard's integer tensors, checked (shard_checks.check_shard), and its hidden width."""
        from safetensors import SafetensorError, safe_open
        try:
            with safe_open(fpath, "pt") as f:
                keys = set(f.keys())
                missing = [k for k in SHARD_KEYS if k not in keys]
                if missing:
                    raise EngineError(f"{fpath}: tensor {missing[0]!r} is missing")
                ints = {k: f.get_tensor(k) for k in INT_KEYS if k in keys}
                shapes = {k: list(f.get_slice(k).get_shape())
                          for k in ("hidden_states", "aux_hidden_states")}
                dtypes = {k: f.get_slice(k).get_dtype()
                          for k in ("hidden_states", "aux_hidden_states")}
        except (SafetensorError, OSError) as e:
            raise EngineError(f"{fpath}: not a readable safetensors file "
                              f"({str(e).splitlines()[0][:160]})") from None
        feature_dtypes(fpath, dtypes)
        check_shard(fpath, ints, shapes, self.vocab_size)
        return ints, shapes["hidden_states"][1]

    def __getitem__(self, i: int) -> Sample:
        from safetensors import safe_open
        fpath, a, b = self._index[i]
        with safe_open(fpath, "pt") as f:
            aux = read_states(f, "aux_hidden_states", a, b, self.dtype)
            hidden = read_states(f, "hidden_states", a, b, self.dtype)
            top = f.get_slice("target_argmax")[a:b].long() if self.has_target_argmax else None
        return Sample(self._ids[i].long(), self._mask[i].long(), aux, hidden, top)

    def tokens(self, i: int) -> tuple[Tensor, Tensor]:
        return self._ids[i].long(), self._mask[i].long()

    def describe(self, i: int) -> str:
        return f"{os.path.basename(self._index[i][0])} sample {self._local[i]}"

    def token_counts(self, vocab_size: int) -> Tensor:
        counts = torch.zeros(vocab_size, dtype=torch.int64)
        for ids, mask in zip(self._ids, self._mask, strict=False):
            counts += torch.bincount(ids.long()[mask.bool()], minlength=vocab_size)[:vocab_size]
        return counts


class SpecForgeData(FeatureData):
    """A directory of SpecForge offline `data_<i>.ckpt` sample files."""

    def __init__(self, path: str, files: list[str]) -> None:
        self.path = path
        self.files = sorted(files, key=lambda p: int(re.findall(r"\d+", os.path.basename(p))[-1]))
        self.meta = {"format": "specforge-offline", "samples": len(self.files)}
        self.aux_layer_ids = None  # SpecForge defaults == ours (2, N//2, N-3)
        self.lengths, self.loss_counts = [], []
        self.hidden_size = 0
        for f in self.files:
            s = self._load(f)
            self.lengths.append(s.input_ids.numel())
            self.loss_counts.append(int(s.loss_mask[2:].sum()))
            self.hidden_size = self.hidden_size or s.hidden.shape[-1]

    @staticmethod
    def _load(fpath: str) -> Sample:
        try:
            d = torch.load(fpath, map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:  # pickle errors, not-a-zip, refused globals
            raise EngineError(f"{fpath}: not a loadable weights-only torch file "
                              f"({str(e).splitlines()[0][:120]})") from None
        if not isinstance(d, dict):
            raise EngineError(f"{fpath}: expected a dict of tensors")
        for key in ("input_ids", "loss_mask", "hidden_state", "aux_hidden_state"):
            if not isinstance(d.get(key), Tensor):
                raise EngineError(f"{fpath}: key {key!r} missing or not a tensor")
        ids = d["input_ids"].reshape(-1).long()
        mask = d["loss_mask"].reshape(-1).long()
        hidden = d["hidden_state"].reshape(-1, d["hidden_state"].shape[-1])
        aux = d["aux_hidden_state"].reshape(-1, d["aux_hidden_state"].shape[-1])
        n = ids.numel()
        if mask.numel() != n or hidden.shape[0] != n or aux.shape[0] != n:
            raise EngineError(f"{fpath}: input_ids, loss_mask, hidden_state and aux_hidden_state "
                              f"disagree on the token count {n}")
        if aux.shape[1] != 3 * hidden.shape[1]:
            raise EngineError(f"{fpath}: aux_hidden_state width {aux.shape[1]} is not 3 x "
                              f"hidden_state width {hidden.shape[1]}")
        return Sample(ids, mask, aux, hidden)

    def __getitem__(self, i: int) -> Sample:
        return self._load(self.files[i])

    def token_counts(self, vocab_size: int) -> Tensor:
        counts = torch.zeros(vocab_size, dtype=torch.int64)
        for f in self.files:
            s = self._load(f)
            counts += torch.bincount(s.input_ids[s.loss_mask.bool()], minlength=vocab_size
                                     )[:vocab_size]
        return counts

class OnlineData(FeatureData):
    """Conversations tokenized up front; features computed by the target at batch time.

    Samples are ordered as prepare writes them (stable sort by length), so an online run and an
    offline run over the same conversations see the same batch plan."""

    def __init__(self, path: str, target: Any, max_len: int) -> None:
        from engine.data.conversations import read_conversations
        from engine.data.prepare import tokenize_all
        self.path = path
        self.target = target
        samples, skipped = tokenize_all(target.tokenizer, read_conversations(path), max_len)
        if not samples:
            raise EngineError(f"{path}: no conversation has an assistant turn to learn from")
        samples = sorted(samples, key=lambda s: len(s[1].input_ids))
        self._ids = [torch.tensor(t.input_ids) for _, t in samples]
        self._mask = [torch.tensor(t.loss_mask) for _, t in samples]
        self.lengths = [len(t.input_ids) for _, t in samples]
        self.loss_counts = [int(m[2:].sum()) for m in self._mask]
        self.hidden_size = target.hidden_size
        self.aux_layer_ids = target.aux_layer_ids
        self.meta = {"format": "online", "samples": len(samples), "skipped": skipped}

    def batch(self, indices: tuple[int, ...] | list[int]) -> dict[str, Tensor]:
        width = max(self.lengths[i] for i in indices)
        ids = torch.zeros(len(indices), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        att = torch.zeros_like(ids)
        for r, i in enumerate(indices):
            n = self.lengths[i]
            ids[r, :n], mask[r, :n], att[r, :n] = self._ids[i], self._mask[i], 1
        aux, hidden = self.target.features(ids, att)
        return {"input_ids": ids, "loss_mask": mask, "attention_mask": att, "aux": aux,
                "hidden": hidden}

    def tokens(self, i: int) -> tuple[Tensor, Tensor]:
        return self._ids[i], self._mask[i]

    def __getitem__(self, i: int) -> Sample:
        b = self.batch([i])
        return Sample(b["input_ids"][0], b["loss_mask"][0], b["aux"][0], b["hidden"][0])

    def token_counts(self, vocab_size: int) -> Tensor:
        counts = torch.zeros(vocab_size, dtype=torch.int64)
        for ids, mask in zip(self._ids, self._mask, strict=False):
            counts += torch.bincount(ids[mask.bool()], minlength=vocab_size)[:vocab_size]
        return counts


def open_data(path: str, target_dir: str | None = None, vocab_size: int | None = None
              ) -> FeatureData:
    """Our shard directory, a SpecForge or a speculators offline directory (module docstring).
    `target_dir` is needed to read speculators data (its last layer is before the final norm);
    `vocab_size` (the target's) bounds the token ids of our shards."""
    if not os.path.isdir(path):
        raise EngineError(f"{path}: not a directory (expected a prepared data directory)")
    if os.path.isfile(os.path.join(path, "manifest.json")):
        data: FeatureData = ShardData(path, vocab_size)
    elif files := glob.glob(os.path.join(path, "data_*.ckpt")):
        data = SpecForgeData(path, files)
    else:
        layout = find_layout(path)
        if layout is None:
            raise EngineError(f"{path}: neither manifest.json, SpecForge data_*.ckpt files nor a "
                              "speculators directory (Arrow rows + hidden_states/hs_*.safetensors)")
        data = SpeculatorsData(path, *layout, target_dir=target_dir)
    if len(data) == 0:
        raise EngineError(f"{path}: no samples")
    return data
