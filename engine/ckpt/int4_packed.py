"""Int4 weights in compressed-tensors' `pack-quantized` format, as Kimi-K2.5 (and Kimi-K2-Thinking)
ship their routed experts: recognised from config.json's `quantization_config` and dequantised
tensor by tensor.

The format (read from compressed-tensors 0.17's source, compressors/pack_quantized/base.py and
helpers.py `pack_to_int32`/`unpack_from_int32`, and quantization/lifecycle/forward_helpers.py
`_dequantize`): a Linear's weight W [out, in] is stored as three tensors,

    <module>.weight_packed  int32 [out, ceil(in / 8)]   eight 4-bit values per word
    <module>.weight_scale   (bf16) [out, in / group_size]  one scale per group along `in`
    <module>.weight_shape   int [2]                      (out, in)

Value q in [-8, 7] is stored offset-binary as the nibble q + 8; column c sits in word c // 8 at
bits 4 * (c % 8) (the first column in the lowest nibble); padding nibbles are zero. Dequantised:
W[o, c] = q[o, c] * scale[o, c // group_size], computed in the scale's dtype (compressed-tensors'
`_dequantize`: `x_q.to(scale.dtype) * scale`), then widened to float32 here.

Kimi's `quantization_config` (as its model cards describe it; the ignore list as vLLM's
tests/quantization humming test quotes Kimi-K2.6's config -- no copy of Kimi-K2.5's own
config.json was at hand when this was written): quant_method `compressed-tensors`, format
`pack-quantized`, one config group of weights {num_bits 4, type int, symmetric, strategy group,
group_size 32}, no activation quantisation; `ignore` keeps attention (`re:.*self_attn.*`), the
shared experts, the dense layers' MLP (`re:.*mlp\\.(gate|up|gate_up|down)_proj.*`), the lm_head
and the vision tower in bf16 -- only `mlp.experts.<e>.{gate,up,down}_proj` are packed.

Anything else (another format, num_bits, type, asymmetric weights with zero points, another
strategy, activation ordering with g_idx, quantised activations) is refused in one line naming
config.json and the field. The tensors are checked from the headers before any is read
(`check_packed`: int32 packed words, a floating-point scale, a weight_shape of two integers, and
a quantization_config at all), and a scale whose weight is NaN or overflows is refused when it is
dequantised; each error names the file and the tensor.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from engine.ckpt.safetensors_io import FLOAT_CODES, Entry
from engine.errors import EngineError
from engine.fileio import read_json

PACKED, SCALE, SHAPE = ".weight_packed", ".weight_scale", ".weight_shape"
BITS = 4
PER_WORD = 32 // BITS
INT_CODES = ("I64", "I32", "I16", "I8", "U8")  # a weight_shape's dtype: whole numbers only


@dataclass(frozen=True)
class PackedInt4:
    """A target's pack-quantized int4 scheme: what dequantise needs."""
    group_size: int


def _quant_config(cfg: dict) -> tuple[str, Any]:
    """(where, quantization_config) at the top level or under a wrapper's text_config."""
    if "quantization_config" in cfg:
        return "quantization_config", cfg["quantization_config"]
    text = cfg.get("text_config")
    if isinstance(text, dict) and "quantization_config" in text:
        return "text_config.quantization_config", text["quantization_config"]
    return "", None


def packed_scheme(target_dir: str) -> PackedInt4 | None:
    """The target's int4 pack-quantized scheme, None for an unquantised target; anything this
    module cannot dequantise is refused naming config.json and the field."""
    path = os.path.join(target_dir, "config.json")
    where, qc = _quant_config(read_json(path, missing="no such file"))
    if qc is None:
        return None

    def refuse(field: str, value: Any, want: str) -> EngineError:
        return EngineError(f"{path}: {where}.{field} is {value!r}; the layer-by-layer reference "
                           f"reads {want} only (compressed-tensors pack-quantized int4, "
                           "symmetric, group strategy)")

    if not isinstance(qc, dict):
        raise refuse("", qc, "an object")
    if qc.get("quant_method") != "compressed-tensors":
        raise refuse("quant_method", qc.get("quant_method"), "'compressed-tensors'")
    if qc.get("format") != "pack-quantized":
        raise refuse("format", qc.get("format"), "'pack-quantized'")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise refuse("config_groups", groups, "a non-empty object")
    sizes = set()
    for g, grp in groups.items():
        f = f"config_groups.{g}"
        if not isinstance(grp, dict) or not isinstance(grp.get("weights"), dict):
            raise refuse(f + ".weights", None if not isinstance(grp, dict)
                         else grp.get("weights"), "an object")
        if grp.get("format", "pack-quantized") != "pack-quantized":
            raise refuse(f + ".format", grp.get("format"), "'pack-quantized'")
        for act in ("input_activations", "output_activations"):
            if grp.get(act) is not None:
                raise refuse(f"{f}.{act}", grp.get(act), "null (weight-only)")
        w = grp["weights"]
        for field, want in (("num_bits", BITS), ("type", "int"), ("symmetric", True),
                            ("strategy", "group")):
            if w.get(field) != want:
                raise refuse(f"{f}.weights.{field}", w.get(field), repr(want))
        if w.get("actorder") not in (None, "static"):  # "group" stores a g_idx permutation
            raise refuse(f + ".weights.actorder", w.get("actorder"), "null or 'static'")
        gs = w.get("group_size")
        if not isinstance(gs, int) or isinstance(gs, bool) or gs <= 0:
            raise refuse(f + ".weights.group_size", gs, "a positive integer")
        sizes.add(gs)
    if len(sizes) != 1:
        raise refuse("config_groups.*.weights.group_size", sorted(sizes), "one group size")
    return PackedInt4(group_size=sizes.pop())


def unpack(packed: Tensor, columns: int) -> Tensor:
    """int32 [out, ceil(columns / 8)] -> int8 [out, columns] in [-8, 7] (module docstring)."""
    if packed.dtype != torch.int32 or packed.dim() != 2:
        raise ValueError(f"packed int4 weights are 2-d int32, not {packed.dtype} "
                         f"{list(packed.shape)}")
    shifts = torch.arange(PER_WORD, dtype=torch.int32) * BITS
    nibbles = (packed.unsqueeze(-1) >> shifts) & 0xF  # arithmetic shift: the mask drops sign
    return (nibbles.flatten(1)[:, :columns] - 8).to(torch.int8)


def check_packed(entries: Mapping[str, Entry], scheme: PackedInt4 | None,
                 config_path: str) -> None:
    """Every packed weight's three tensors, from the headers (no data read): present, with the
    format's dtypes and dimensions; packed tensors in a target whose config declares no scheme
    are refused (transformers would skip them and randomly initialise those weights)."""
    def bad(name: str, want: str) -> EngineError:
        e = entries[name]
        return EngineError(f"{e.file}: {name} is {e.dtype} {list(e.shape)}; {want}")

    for name in entries:
        if not name.endswith(PACKED):
            continue
        b, file = name[: -len(PACKED)], entries[name].file
        if scheme is None:
            raise EngineError(f"{file}: {name} is packed but {config_path} has no "
                              "quantization_config (transformers would load that weight "
                              "randomly initialised)")
        for suffix in (SCALE, SHAPE):
            if b + suffix not in entries:
                raise EngineError(f"{file}: {name} without {b}{suffix}")
        if entries[name].dtype != "I32" or len(entries[name].shape) != 2:
            raise bad(name, f"packed int4 weights are 2-d I32 ({PER_WORD} values per word)")
        if entries[b + SCALE].dtype not in FLOAT_CODES or len(entries[b + SCALE].shape) != 2:
            raise bad(b + SCALE, "int4 scales are 2-d floats (one per group along the input)")
        if entries[b + SHAPE].dtype not in INT_CODES or entries[b + SHAPE].shape != (2,):
            raise bad(b + SHAPE, "a weight_shape is 2 integers (out, in)")


def dequantise(packed: Tensor, scale: Tensor, shape: Tensor | list[int],
               group_size: int, name: str = "weight") -> Tensor:
    """The float32 weight [out, in] of one pack-quantized Linear; `name` (the module, prefixed
    by its file) starts every error."""
    if isinstance(shape, Tensor) and (shape.is_floating_point() or shape.is_complex()):
        raise EngineError(f"{name}{SHAPE}: {shape.dtype}, not whole numbers")
    dims = shape.tolist() if isinstance(shape, Tensor) else list(shape)
    if len(dims) != 2 or not all(isinstance(d, int) and d > 0 for d in dims):
        raise EngineError(f"{name}{SHAPE}: {dims!r}, want 2 positive integers (out, in)")
    if packed.dtype != torch.int32 or packed.dim() != 2:
        raise EngineError(f"{name}{PACKED}: {packed.dtype} {list(packed.shape)}, want 2-d "
                          f"int32 ({PER_WORD} int4 per word)")
    if not scale.is_floating_point():
        raise EngineError(f"{name}{SCALE}: {scale.dtype}, want a floating-point scale")
    out, cols = dims
    if packed.shape[0] != out or packed.shape[1] != -(-cols // PER_WORD):
        raise EngineError(f"{name}{PACKED}: shape {list(packed.shape)} does not hold "
                          f"{name}{SHAPE} {[out, cols]} at {PER_WORD} int4 per int32")
    if cols % group_size or list(scale.shape) != [out, cols // group_size]:
        raise EngineError(f"{name}{SCALE}: shape {list(scale.shape)}, want "
                          f"{[out, cols // group_size]} for {[out, cols]} in groups of "
                          f"{group_size}")
    q = unpack(packed, cols)
    w = q.to(scale.dtype) * scale.repeat_interleave(group_size, dim=1)
    if not torch.isfinite(w).all():  # a NaN scale, or one whose product overflows its dtype
        o, c = (int(i) for i in (~torch.isfinite(w)).nonzero()[0])
        raise EngineError(f"{name}{SCALE}: row {o}, group {c // group_size} is "
                          f"{float(scale[o, c // group_size])!r}: the dequantised weight is "
                          f"not finite in {scale.dtype}")
    return w.float()


def dequantise_stored(sd: dict[str, Tensor], scheme: PackedInt4 | None,
                      files: Mapping[str, Path | str]) -> dict[str, Tensor]:
    """A state dict with every `<m>.weight_packed` (+ scale, shape) replaced by `<m>.weight`;
    `files` names each stored tensor's file for the errors. Packed tensors in a target whose
    config declares no scheme are refused."""
    bases = [n[: -len(PACKED)] for n in sd if n.endswith(PACKED)]
    if not bases:
        return sd
    if scheme is None:
        raise EngineError(f"{files[bases[0] + PACKED]}: {bases[0]}{PACKED} is packed but "
                          "config.json has no quantization_config")
    out = dict(sd)
    for b in bases:
        for suffix in (SCALE, SHAPE):
            if b + suffix not in out:
                raise EngineError(f"{files[b + PACKED]}: {b}{PACKED} without {b}{suffix}")
        out[b + ".weight"] = dequantise(out.pop(b + PACKED), out.pop(b + SCALE),
                                        out.pop(b + SHAPE), scheme.group_size,
                                        f"{files[b + PACKED]}: {b}")
    return out


def float_numel(name: str, shape: tuple[int, ...] | list[int], names: set[str]) -> int:
    """Elements the tensor `name` holds once dequantised: a packed weight counts its int4
    values (8 per int32 word), its scale and shape count nothing (they become the weight)."""
    n = 1
    for d in shape:
        n *= int(d)
    if name.endswith(PACKED):
        return n * PER_WORD
    for suffix in (SCALE, SHAPE):
        if name.endswith(suffix) and name[: -len(suffix)] + PACKED in names:
            return 0
    return n
