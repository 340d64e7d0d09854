"""One sample as one store object: its token ids, loss mask, aux and final hidden states (and
the target's argmax when the data has it), written into a registered buffer and read back with
every field checked against what the run's manifest says the sample must be.

Layout: the magic `EAGLE3S1`, a little-endian u32 header length, a JSON header
`{"tensors": [[name, dtype, shape, offset], ...]}`, then each tensor's bytes at its offset
(64-byte aligned). Ids travel as int32, the mask as uint8, the states in the data's dtype; the
reader gives back the Sample the offline reader would (ids and mask int64). A wrong magic,
dtype, shape or size is one line naming the key.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

import torch
from torch import Tensor

from engine.data.features import Sample
from engine.errors import EngineError

MAGIC = b"EAGLE3S1"
_ALIGN = 64
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "int32": torch.int32, "uint8": torch.uint8}


@dataclass(frozen=True)
class SampleSpec:
    """What one sample must be: its length, the hidden width, the states' dtype and whether the
    target's argmax travels with it."""

    length: int
    hidden: int
    dtype: str
    argmax: bool

    def shapes(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        t, h = self.length, self.hidden
        out = {"input_ids": ("int32", (t,)), "loss_mask": ("uint8", (t,)),
               "aux": (self.dtype, (t, 3 * h)), "hidden": (self.dtype, (t, h))}
        if self.argmax:
            out["target_argmax"] = ("int32", (t,))
        return out


def _round(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _layout(spec: SampleSpec) -> tuple[bytes, list[tuple[str, str, tuple[int, ...], int]], int]:
    items, off = [], 0
    for name, (dtype, shape) in spec.shapes().items():
        items.append((name, dtype, shape, off))
        off += _round(math.prod(shape) * _DTYPES[dtype].itemsize)
    header = json.dumps({"tensors": [[n, d, list(s), o] for n, d, s, o in items]},
                        separators=(",", ":")).encode()
    return header, items, off


def encoded_size(spec: SampleSpec) -> int:
    header, _, body = _layout(spec)
    return _round(len(MAGIC) + 4 + len(header)) + body


def encode(sample: Sample, spec: SampleSpec, out: Tensor) -> int:
    """Write `sample` into the uint8 tensor `out` (at least `encoded_size(spec)` bytes); returns
    the object's size."""
    header, items, body = _layout(spec)
    start = _round(len(MAGIC) + 4 + len(header))
    head = MAGIC + struct.pack("<I", len(header)) + header
    out[:len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
    for name, dtype, shape, off in items:
        src = getattr(sample, name)
        n = math.prod(shape) * _DTYPES[dtype].itemsize
        view = out[start + off:start + off + n].view(_DTYPES[dtype]).view(shape)
        view.copy_(src.reshape(shape))
    return start + body


def decode(data: Tensor, spec: SampleSpec, key: str) -> Sample:
    """The Sample in the uint8 tensor `data` (copied out: `data` may be a reused buffer)."""
    head = bytes(data[:len(MAGIC) + 4].numpy())
    if len(head) < len(MAGIC) + 4 or head[:len(MAGIC)] != MAGIC:
        raise EngineError(f"stream object {key}: not a sample of ours (magic "
                          f"{head[:len(MAGIC)]!r})")
    (hlen,) = struct.unpack("<I", head[len(MAGIC):])
    if hlen > 65536 or len(MAGIC) + 4 + hlen > data.numel():
        raise EngineError(f"stream object {key}: header of {hlen} bytes does not fit the "
                          f"{data.numel()}-byte object")
    try:
        header = json.loads(bytes(data[len(MAGIC) + 4:len(MAGIC) + 4 + hlen].numpy()))
        got = {str(n): (str(d), tuple(int(x) for x in s), int(o))
               for n, d, s, o in header["tensors"]}
    except (ValueError, KeyError, TypeError) as e:
        raise EngineError(f"stream object {key}: unreadable header ({e})") from None
    want = spec.shapes()
    if set(got) != set(want):
        raise EngineError(f"stream object {key}: tensors {sorted(got)}, expected {sorted(want)}")
    start = _round(len(MAGIC) + 4 + hlen)
    fields: dict[str, Tensor] = {}
    for name, (dtype, shape) in want.items():
        gdtype, gshape, off = got[name]
        if gdtype != dtype:
            raise EngineError(f"stream object {key}: tensor {name!r} is {gdtype}, expected "
                              f"{dtype}")
        if gshape != shape:
            raise EngineError(f"stream object {key}: tensor {name!r} has shape {list(gshape)}, "
                              f"expected {list(shape)}")
        n = math.prod(shape) * _DTYPES[dtype].itemsize
        if off < 0 or start + off + n > data.numel():
            raise EngineError(f"stream object {key}: tensor {name!r} runs past the object's "
                              f"{data.numel()} bytes")
        fields[name] = data[start + off:start + off + n].view(_DTYPES[dtype]).view(shape).clone()
    top = fields.get("target_argmax")
    return Sample(fields["input_ids"].long(), fields["loss_mask"].long(), fields["aux"],
                  fields["hidden"], top.long() if top is not None else None)
