"""FP8 feature storage: a data directory's aux and final states as `float8_e4m3fn` with a float32
scale per token (and, for the aux states, per layer), the form speculators' FP8 hidden-state
backend stores: 1 byte a value instead of 2 (bf16) or 4, so 50k conversations of 2k tokens of a
7168-wide target take ~2.9 TB instead of ~5.7 TB (engine/data/disk_estimate.py).

    scale[t, c] = max |x[t, c, :]| / 448          (448: float8_e4m3fn's largest finite value)
    q[t, c, :]  = float8_e4m3fn(x[t, c, :] / scale[t, c])
    x'          = q.float() * scale               (relative error <= 2^-4 per value)

A shard stores `aux_hidden_states` [N, 3Ht] and `hidden_states` [N, Ht] as float8_e4m3fn beside
`aux_hidden_states_scale` [N, 3] and `hidden_states_scale` [N, 1] (float32); the manifest's
`storage` says `float8_e4m3fn` (absent or the manifest dtype: full precision, as before). Readers
call `read_states`, which dequantises to the manifest's dtype when the scale is there, so
training and eval see ordinary tensors.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

FP8 = torch.float8_e4m3fn
FP8_NAME = "float8_e4m3fn"
FP8_MAX = float(torch.finfo(FP8).max)
SCALE_SUFFIX = "_scale"
#: bytes a token's scales take in a shard: 3 aux + 1 final, float32
SCALE_BYTES_PER_TOKEN = 4 * 4


def quantize(x: Tensor, chunks: int) -> tuple[Tensor, Tensor]:
    """x [T, chunks*W] -> (float8_e4m3fn [T, chunks*W], float32 scale [T, chunks])."""
    t, w = x.shape
    xs = x.float().reshape(t, chunks, w // chunks)
    scale = xs.abs().amax(-1, keepdim=True).clamp_min(1e-30) / FP8_MAX
    q = (xs / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.reshape(t, w), scale.reshape(t, chunks)


def dequantize(q: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """The inverse of `quantize`, in `dtype`."""
    t, w = q.shape
    c = scale.shape[-1]
    x = q.float().reshape(t, c, w // c) * scale.float().reshape(t, c, 1)
    return x.reshape(t, w).to(dtype)


def read_states(f: Any, name: str, a: int, b: int, dtype: torch.dtype) -> Tensor:
    """Rows a..b-1 of tensor `name` from an open safetensors file `f`: dequantised to `dtype`
    when the shard stores it as FP8 (a `name_scale` tensor beside it), as stored otherwise."""
    x = f.get_slice(name)[a:b]
    if name + SCALE_SUFFIX not in f.keys():  # noqa: SIM118 (safe_open has no __contains__)
        return x
    return dequantize(x, f.get_slice(name + SCALE_SUFFIX)[a:b], dtype)


def value_bytes(store: torch.dtype, fp8: bool) -> tuple[int, int]:
    """(bytes a stored value takes, extra bytes a token's scales take)."""
    if fp8:
        return 1, SCALE_BYTES_PER_TOKEN
    return torch.tensor([], dtype=store).element_size(), 0
