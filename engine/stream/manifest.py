"""What the trainer must know of a stream run before the first sample arrives: the samples'
lengths, loss counts and token ids (the batch plan, the draft vocab and the held-out prompts
need them), the hidden width, the aux layer ids, the states' dtype, whether the target's argmax
travels, the data's provenance and a digest of its content.

The producer puts it once under RUN/manifest; the trainer reads it into a frozen
`StreamManifest`, every field checked (one line naming the field). Bytes: a little-endian u32
length, a JSON object, then the token ids of every sample (int32) and the loss masks (uint8),
in sample order.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from engine.errors import EngineError
from engine.stream.codec import SampleSpec

_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class StreamManifest:
    lengths: tuple[int, ...]
    loss_counts: tuple[int, ...]
    hidden_size: int
    aux_layer_ids: tuple[int, ...] | None
    dtype: str
    argmax: bool
    meta: dict[str, Any]
    digest: str
    ids: Tensor   # int32, every sample's ids end to end
    masks: Tensor  # uint8, likewise

    def spec(self, i: int) -> SampleSpec:
        return SampleSpec(self.lengths[i], self.hidden_size, self.dtype, self.argmax)

    def tokens(self, i: int) -> tuple[Tensor, Tensor]:
        a = self._offsets()[i]
        b = a + self.lengths[i]
        return self.ids[a:b].long(), self.masks[a:b].long()

    def _offsets(self) -> list[int]:
        cached = self.__dict__.get("_off")
        if cached is None:
            cached = [0]
            for n in self.lengths:
                cached.append(cached[-1] + n)
            object.__setattr__(self, "_off", cached)
        return cached


def build(data: Any, dtype: str, meta: dict[str, Any], digest: str | None = None
          ) -> StreamManifest:
    """The manifest of a FeatureData (its tokens read without hidden states)."""
    ids, masks = [], []
    for i in range(len(data)):
        a, m = data.tokens(i)
        ids.append(a.to(torch.int32))
        masks.append(m.to(torch.uint8))
    all_ids, all_masks = torch.cat(ids), torch.cat(masks)
    if digest is None:
        h = hashlib.sha256(all_ids.numpy().tobytes())
        h.update(all_masks.numpy().tobytes())
        digest = h.hexdigest()
    aux = getattr(data, "aux_layer_ids", None)
    return StreamManifest(tuple(data.lengths), tuple(data.loss_counts), int(data.hidden_size),
                          tuple(aux) if aux else None, dtype, bool(data.has_target_argmax),
                          meta, digest, all_ids, all_masks)


def encode(m: StreamManifest) -> bytes:
    head = json.dumps({"lengths": list(m.lengths), "loss_counts": list(m.loss_counts),
                       "hidden_size": m.hidden_size, "aux_layer_ids": m.aux_layer_ids,
                       "dtype": m.dtype, "argmax": m.argmax, "meta": m.meta,
                       "digest": m.digest}, separators=(",", ":")).encode()
    return (struct.pack("<I", len(head)) + head + m.ids.numpy().tobytes()
            + m.masks.numpy().tobytes())


def decode(raw: bytes, key: str) -> StreamManifest:
    def bad(what: str) -> EngineError:
        return EngineError(f"stream manifest {key}: {what}")
    if len(raw) < 4:
        raise bad("truncated")
    (n,) = struct.unpack("<I", raw[:4])
    try:
        d = json.loads(raw[4:4 + n])
    except ValueError as e:
        raise bad(f"not JSON ({e})") from None
    if not isinstance(d, dict):
        raise bad("not a JSON object")
    lengths, counts = d.get("lengths"), d.get("loss_counts")
    if not isinstance(lengths, list) or not all(isinstance(x, int) and x > 0 for x in lengths):
        raise bad("field 'lengths': expected a list of positive integers")
    if not lengths:
        raise bad("field 'lengths': no samples")
    if not isinstance(counts, list) or len(counts) != len(lengths) or \
            not all(isinstance(x, int) and x >= 0 for x in counts):
        raise bad(f"field 'loss_counts': expected {len(lengths)} integers >= 0")
    hidden = d.get("hidden_size")
    if not isinstance(hidden, int) or hidden < 1:
        raise bad("field 'hidden_size': expected a positive integer")
    aux = d.get("aux_layer_ids")
    if aux is not None and (not isinstance(aux, list) or len(aux) != 3
                            or not all(isinstance(x, int) for x in aux)):
        raise bad("field 'aux_layer_ids': expected 3 integers or null")
    if d.get("dtype") not in _DTYPES:
        raise bad(f"field 'dtype': {d.get('dtype')!r} is not one of {', '.join(_DTYPES)}")
    if not isinstance(d.get("argmax"), bool):
        raise bad("field 'argmax': expected true or false")
    if not isinstance(d.get("meta"), dict) or not isinstance(d.get("digest"), str):
        raise bad("fields 'meta' and 'digest': expected an object and a string")
    total = sum(lengths)
    body = raw[4 + n:]
    if len(body) != 5 * total:
        raise bad(f"{len(body)} bytes of tokens, expected {5 * total} for {total} tokens")
    ids = torch.frombuffer(bytearray(body[:4 * total]), dtype=torch.int32)
    masks = torch.frombuffer(bytearray(body[4 * total:]), dtype=torch.uint8)
    return StreamManifest(tuple(lengths), tuple(counts), hidden,
                          tuple(aux) if aux is not None else None, d["dtype"], d["argmax"],
                          d["meta"], d["digest"], ids, masks)
