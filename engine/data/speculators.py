"""speculators offline data in: its preprocessed rows beside its `hs_<i>.safetensors` files.

The layout, as vllm-project/speculators writes and reads it (scripts/prepare_data.py,
scripts/data_generation_offline.py, scripts/launch_vllm.py, src/speculators/train/data.py):

    DIR/                       a Hugging Face `datasets` save_to_disk directory (prepare_data.py):
      state.json                 `_data_files`: the Arrow files in row order
      dataset_info.json
      data-00000-of-0000N.arrow  Arrow IPC stream; per row `input_ids` (int64 list), `loss_mask`
                                 (int64 list, 1 on trained tokens), `seq_len` (+ `messages` for
                                 multimodal rows)
      hidden_states/hs_<i>.safetensors    one per row i (the vLLM connector's file, moved there):
          hidden_states  [T, L, H]  the target's dtype; L = the layer ids the vLLM server was
                                    started with, in order, by default [2, N//2, N-3, N]
          token_ids      [T] int64  the prompt, equal to row i's input_ids

vLLM layer id k < N is the INPUT of decoder layer k; id N is the last layer's
output BEFORE the final norm (speculators applies its own `verifier_norm` to it). Slots 0..L-2 are
therefore our aux states, concatenated low|mid|high, and the final-norm hidden state our trainer
wants is the target's final norm applied to slot L-1: this reader does that with the norm's
weight alone (engine/ckpt/final_norm.py), so `train --data DIR` needs `--target`, as it always
does. Rows without an hs file (a partial generation run) are left out and counted in meta. The
layer ids are not recorded in the directory; like SpecForge's, they are taken to be the defaults.
`--data` may name DIR or DIR/hidden_states. Reading Arrow needs pyarrow.
"""

from __future__ import annotations

import os
import re
from typing import Any

import torch
from torch import Tensor

from engine.data.features import FeatureData, Sample
from engine.errors import EngineError
from engine.fileio import read_json

HS_FILE = re.compile(r"^hs_(\d+)\.safetensors$")


def find_layout(path: str) -> tuple[str, str] | None:
    """(dataset dir, hidden_states dir) when `path` is a speculators directory, else None."""
    def is_dataset(d: str) -> bool:
        return os.path.isfile(os.path.join(d, "state.json")) or any(
            n.endswith(".arrow") for n in os.listdir(d))

    def has_hs(d: str) -> bool:
        return os.path.isdir(d) and any(HS_FILE.match(n) for n in os.listdir(d))

    sub = os.path.join(path, "hidden_states")
    if has_hs(sub) and is_dataset(path):
        return path, sub
    parent = os.path.dirname(os.path.abspath(path))
    if has_hs(path) and is_dataset(parent):
        return parent, path
    return None


def arrow_files(ds_dir: str) -> list[str]:
    """The dataset's Arrow files in row order (state.json's `_data_files`, else by name)."""
    state = os.path.join(ds_dir, "state.json")
    if os.path.isfile(state):
        doc = read_json(state)
        try:
            files = [d["filename"] for d in doc["_data_files"]]
        except (KeyError, TypeError) as e:
            raise EngineError(f"{state}: field '_data_files': missing or malformed ({e})"
                              ) from None
    else:
        files = sorted(n for n in os.listdir(ds_dir) if n.endswith(".arrow"))
    if not files:
        raise EngineError(f"{ds_dir}: no Arrow data files")
    return [os.path.join(ds_dir, f) for f in files]


def read_rows(ds_dir: str) -> tuple[list[Tensor], list[Tensor]]:
    """Every row's input_ids and loss_mask (int64), in dataset order."""
    try:
        import pyarrow as pa
    except ImportError:
        raise EngineError(f"{ds_dir}: reading a speculators directory needs pyarrow "
                          "(pip install pyarrow)") from None
    ids: list[Tensor] = []
    masks: list[Tensor] = []
    for fpath in arrow_files(ds_dir):
        try:
            with pa.memory_map(fpath) as src:
                try:
                    table = pa.ipc.open_stream(src).read_all()  # what `datasets` writes
                except pa.ArrowInvalid:
                    src.seek(0)
                    table = pa.ipc.open_file(src).read_all()
        except (OSError, pa.ArrowException) as e:
            raise EngineError(f"{fpath}: not an Arrow file ({str(e).splitlines()[0]})") from None
        for col in ("input_ids", "loss_mask"):
            if col not in table.column_names:
                raise EngineError(f"{fpath}: column {col!r} is missing")
        ids += _lists(table.column("input_ids"))
        masks += _lists(table.column("loss_mask"))
    return ids, masks


def _lists(col: Any) -> list[Tensor]:
    """An Arrow list<int> column as one int64 tensor per row (no Python-int round trip)."""
    out: list[Tensor] = []
    for chunk in col.chunks:
        flat = torch.from_numpy(chunk.flatten().to_numpy(zero_copy_only=False).astype("int64"))
        offs = chunk.offsets.to_numpy()
        base = int(offs[0])
        out += [flat[int(a) - base:int(b) - base] for a, b in zip(offs[:-1], offs[1:], strict=True)]
    return out


class SpeculatorsData(FeatureData):
    """A speculators offline directory (module docstring)."""

    def __init__(self, path: str, ds_dir: str, hs_dir: str, target_dir: str | None = None
                 ) -> None:
        from safetensors import safe_open
        self.path = path
        self.target_dir = target_dir
        self._norm: Any = None
        ids, masks = read_rows(ds_dir)
        present = sorted(int(m.group(1)) for n in os.listdir(hs_dir) if (m := HS_FILE.match(n)))
        extra = [i for i in present if i >= len(ids)]
        if extra:
            raise EngineError(f"{os.path.join(hs_dir, f'hs_{extra[0]}.safetensors')}: no row "
                              f"{extra[0]} in {ds_dir} ({len(ids)} rows)")
        self.files: list[str] = []
        self._ids: list[Tensor] = []
        self._mask: list[Tensor] = []
        self.lengths, self.loss_counts = [], []
        self.hidden_size = 0
        for i in present:
            fpath = os.path.join(hs_dir, f"hs_{i}.safetensors")
            try:
                with safe_open(fpath, "pt") as f:
                    keys = set(f.keys())
                    for key in ("hidden_states", "token_ids"):
                        if key not in keys:
                            raise EngineError(f"{fpath}: tensor {key!r} is missing")
                    shape = list(f.get_slice("hidden_states").get_shape())
                    tok = f.get_tensor("token_ids").reshape(-1).long()
            except EngineError:
                raise
            except Exception as e:  # a torn or foreign file
                raise EngineError(f"{fpath}: not a safetensors file ({str(e).splitlines()[0]})"
                                  ) from None
            if len(shape) != 3 or shape[1] != 4:
                raise EngineError(f"{fpath}: hidden_states shape {shape}: expected [T, 4, H] "
                                  "(3 aux layers + the last layer)")
            if ids[i].numel() != masks[i].numel():
                raise EngineError(f"{ds_dir}: row {i}: input_ids and loss_mask lengths differ")
            if not torch.equal(tok, ids[i]) or shape[0] != tok.numel():
                raise EngineError(f"{fpath}: token_ids ({tok.numel()} tokens) differ from row "
                                  f"{i}'s input_ids in {ds_dir} ({ids[i].numel()} tokens)")
            if self.hidden_size and shape[2] != self.hidden_size:
                raise EngineError(f"{fpath}: hidden size {shape[2]}, other files have "
                                  f"{self.hidden_size}")
            self.hidden_size = shape[2]
            self.files.append(fpath)
            self._ids.append(ids[i])
            self._mask.append(masks[i])
            self.lengths.append(ids[i].numel())
            self.loss_counts.append(int(masks[i][2:].sum()))
        self.aux_layer_ids = None  # not recorded; speculators' defaults == ours
        self.meta = {"format": "speculators-offline", "samples": len(self.files),
                     "rows": len(ids), "rows_without_hidden_states": len(ids) - len(self.files)}

    def norm(self) -> Any:
        if self._norm is None:
            if self.target_dir is None:
                raise EngineError(f"{self.path}: speculators data holds the last layer before "
                                  "the final norm; reading it needs the target (--target)")
            from engine.ckpt.final_norm import load_final_norm
            from engine.data.target import read_config
            self._norm = load_final_norm(self.target_dir, read_config(self.target_dir))
        return self._norm

    def __getitem__(self, i: int) -> Sample:
        from safetensors import safe_open
        with safe_open(self.files[i], "pt") as f:
            hs = f.get_tensor("hidden_states")  # [T, 4, H]
        aux = hs[:, :-1].reshape(hs.shape[0], -1)  # low|mid|high, [T, 3H]
        return Sample(self._ids[i], self._mask[i].long(), aux, self.norm()(hs[:, -1]))

    def tokens(self, i: int) -> tuple[Tensor, Tensor]:
        return self._ids[i], self._mask[i].long()

    def token_counts(self, vocab_size: int) -> Tensor:
        counts = torch.zeros(vocab_size, dtype=torch.int64)
        for ids, mask in zip(self._ids, self._mask, strict=True):
            counts += torch.bincount(ids[mask.bool()], minlength=vocab_size)[:vocab_size]
        return counts
