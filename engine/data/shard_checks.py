"""What a prepared data directory (engine/data/prepare.py) must hold before anything trusts it,
checked once when it is opened (engine/data/readers.py's ShardData).

A manifest or shard can lie: a shard listed twice or outside the directory, `samples` that
disagree with the shards, offsets that run backwards, float token ids, loss-mask values other
than 0 and 1, ids or `target_argmax` past the vocab, a truncated file. Each is one EngineError
naming the file, the field or tensor, and the sample. The checks read safetensors headers and the
small integer tensors only (ids, mask, offsets, argmax: one vectorised pass per shard), never the
hidden states.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor

from engine.errors import EngineError

INT_KEYS = ("input_ids", "loss_mask", "offsets", "target_argmax")


def manifest_files(meta: Any, mpath: str) -> list[str]:
    """The manifest's shard file names, each a plain name in the directory, listed once; its
    `target` an object when present."""
    target = meta.get("target", {})
    if not isinstance(target, dict):
        raise EngineError(f"{mpath}: field 'target': must be an object")
    hidden = target.get("hidden_size", 0)
    if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden < 0:
        raise EngineError(f"{mpath}: field 'target.hidden_size': must be a positive integer")
    shards = meta.get("shards")
    if not isinstance(shards, list) or not shards:
        raise EngineError(f"{mpath}: field 'shards': missing or empty")
    files: list[str] = []
    for i, s in enumerate(shards):
        name = s.get("file") if isinstance(s, dict) else None
        if not isinstance(name, str):
            raise EngineError(f"{mpath}: field 'shards[{i}]': must be an object with a "
                              "'file' name")
        if not name or os.path.basename(name) != name or name in (".", ".."):
            raise EngineError(f"{mpath}: field 'shards[{i}].file': {name!r} is not a file name "
                              "in the data directory")
        if name in files:
            raise EngineError(f"{mpath}: field 'shards[{i}].file': {name!r} is listed twice")
        files.append(name)
    return files


def manifest_vocab_size(meta: dict[str, Any], mpath: str) -> int | None:
    """The target vocab size the manifest records (prepare writes `target.vocab_size`)."""
    v = meta.get("target", {}).get("vocab_size")
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise EngineError(f"{mpath}: field 'target.vocab_size': must be a positive integer")
    return v


def check_count(mpath: str, field: str, said: Any, found: int, what: str) -> None:
    """A count the manifest states must be what the shards hold."""
    if said is not None and said != found:
        raise EngineError(f"{mpath}: field {field!r} is {said!r} but {what} {found}")


def _sample(off: Tensor, pos: int) -> int:
    """The sample that token position `pos` of a shard belongs to."""
    return int(torch.searchsorted(off, torch.tensor([pos]), right=True)[0]) - 1


def check_shard(fpath: str, t: dict[str, Tensor], shapes: dict[str, list[int]],
                vocab_size: int | None) -> None:
    """One shard's integer tensors `t` (input_ids, loss_mask, offsets, maybe target_argmax) and
    the header shapes of its feature tensors, against each other and the vocab."""
    for key, x in t.items():
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise EngineError(f"{fpath}: tensor {key!r} is {str(x.dtype)[6:]}, expected integers")
        if x.dim() != 1:
            raise EngineError(f"{fpath}: tensor {key!r} has shape {list(x.shape)}, expected 1-D")
    ids, mask, off = t["input_ids"], t["loss_mask"], t["offsets"].long()
    n = ids.numel()
    if off.numel() < 2 or int(off[0]) != 0 or int(off[-1]) != n:
        raise EngineError(f"{fpath}: tensor 'offsets' must run from 0 to the token count {n}")
    steps = off[1:] - off[:-1]
    if bool((steps <= 0).any()):
        k = int((steps <= 0).nonzero()[0])
        raise EngineError(f"{fpath}: tensor 'offsets': sample {k} ends at {int(off[k + 1])}, "
                          f"not after its start {int(off[k])}")
    for key in ("loss_mask", "target_argmax"):
        if key in t and t[key].numel() != n:
            raise EngineError(f"{fpath}: tensors disagree on the token count {n} ({key!r} holds "
                              f"{t[key].numel()})")
    for key in ("hidden_states", "aux_hidden_states"):
        if len(shapes[key]) != 2 or shapes[key][0] != n:
            raise EngineError(f"{fpath}: tensor {key!r} has shape {shapes[key]}, expected "
                              f"[{n}, width] (tensors disagree on the token count {n})")
    hs, ax = shapes["hidden_states"][1], shapes["aux_hidden_states"][1]
    if ax != 3 * hs:
        raise EngineError(f"{fpath}: aux_hidden_states width {ax} is not 3 x hidden_states width "
                          f"{hs}")
    bad = (mask != 0) & (mask != 1)
    if bool(bad.any()):
        pos = int(bad.nonzero()[0])
        raise EngineError(f"{fpath}: tensor 'loss_mask': sample {_sample(off, pos)} holds "
                          f"{int(mask[pos])} (values must be 0 or 1)")
    for key in ("input_ids", "target_argmax"):
        if key not in t:
            continue
        x = t[key]
        out = (x < 0) if vocab_size is None else (x < 0) | (x >= vocab_size)
        if bool(out.any()):
            pos = int(out.nonzero()[0])
            bound = "" if vocab_size is None else f" [0, {vocab_size})"
            raise EngineError(f"{fpath}: tensor {key!r}: sample {_sample(off, pos)} holds token "
                              f"id {int(x[pos])}, outside the target vocab{bound}")


def feature_dtypes(fpath: str, dtypes: dict[str, str]) -> None:
    """Hidden states must be floating point (safetensors dtype codes from the header)."""
    for key in ("hidden_states", "aux_hidden_states"):
        if dtypes[key] not in ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"):
            raise EngineError(f"{fpath}: tensor {key!r} is {dtypes[key]}, expected floating point")
