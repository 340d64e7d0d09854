"""The Kimi-K2.5-shaped wrapper (tests/kimi_target.py) as Kimi ships it: routed experts in int4,
compressed-tensors `pack-quantized` (engine/ckpt/int4_packed.py's docstring has the format), and
its dequantised twin.

Each `mlp.experts.<e>.{gate,up,down}_proj.weight` is quantised symmetrically in groups of 32
along the input dim (scale = max |w| / 7 in bf16, q = round(w / scale) clamped to [-8, 7]) and
written as `weight_packed` (int32, packed here by this file's own loop, independently of the
engine's unpack), `weight_scale` and `weight_shape`, with a quantization_config like Kimi's. The
twin is the plain DeepSeek-V3 text stack whose expert weights are exactly dequant(q) --
`q.to(bf16) * scale` widened to float32, compressed-tensors' order of operations -- and every
other tensor unchanged.

`build_int4_pair(*kimi_pair, out)` builds the pair from tests/kimi_target.py's; a test module
makes it a fixture (importing this file and naming it a plugin both would trip pytest's assert
rewriting).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch

GROUP = 32
EXPERT = re.compile(r"\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")
# Kimi-K2-Thinking / K2.5's quantization_config (the ignore list as vLLM's tests quote Kimi-K2.6's)
KIMI_QUANT = {
    "quant_method": "compressed-tensors", "format": "pack-quantized",
    "quantization_status": "compressed", "kv_cache_scheme": None,
    "config_groups": {"group_0": {
        "targets": ["Linear"], "input_activations": None, "output_activations": None,
        "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                    "group_size": GROUP, "dynamic": False, "actorder": None,
                    "observer": "minmax", "observer_kwargs": {}, "block_structure": None}}},
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
               r"re:.*mlp\.(gate|up|gate_up|down)_proj.*", "re:vision_tower.*",
               "re:mm_projector.*"],
}


def quantise(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [out, in] in [-8, 7], scale bf16 [out, in / 32]): symmetric, per group of 32."""
    g = w.float().view(w.shape[0], -1, GROUP)
    scale = (g.abs().amax(-1) / 7).clamp_min(1e-8).to(torch.bfloat16)
    q = torch.round(g / scale.float().unsqueeze(-1)).clamp(-8, 7).to(torch.int8)
    return q.view(w.shape), scale


def pack(q: torch.Tensor) -> torch.Tensor:
    """int8 [out, in] -> int32 [out, ceil(in / 8)]: value q + 8 in bits 4i..4i+3 of word c // 8
    for column c = 8 * word + i; built as a Python int per word, then read as a signed int32."""
    rows, cols = q.shape
    words = -(-cols // 8)
    out = torch.zeros(rows, words, dtype=torch.int32)
    nib = (q.to(torch.int64) + 8).tolist()
    for r in range(rows):
        for j in range(words):
            v = 0
            for i in range(8):
                c = 8 * j + i
                v |= (nib[r][c] if c < cols else 0) << (4 * i)
            out[r, j] = v - (1 << 32) if v >= 1 << 31 else v
    return out


def dequant(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (q.to(scale.dtype) * scale.repeat_interleave(GROUP, dim=1)).float()


def build_int4_pair(wrapped: Path, plain: Path, out: Path) -> tuple[Path, Path]:
    """(int4 wrapper dir, dequantised plain twin dir) under `out`."""
    from safetensors.torch import load_file, save_file
    int4, twin = out / "kimi-k25-int4", out / "dequantised"
    shutil.copytree(wrapped, int4)
    shutil.copytree(plain, twin)
    sd = load_file(str(wrapped / "model.safetensors"))
    packed: dict[str, torch.Tensor] = {}
    deq: dict[str, torch.Tensor] = {}
    for name, w in sd.items():
        if not EXPERT.search(name):
            packed[name] = w
            continue
        q, scale = quantise(w)
        base = name[: -len(".weight")]
        packed |= {base + ".weight_packed": pack(q), base + ".weight_scale": scale,
                   base + ".weight_shape": torch.tensor(list(w.shape), dtype=torch.int64)}
        deq[name.removeprefix("language_model.")] = dequant(q, scale)
    assert deq, "no routed expert weights in the wrapper"
    save_file(packed, str(int4 / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((int4 / "config.json").read_text())
    (int4 / "config.json").write_text(json.dumps(cfg | {"quantization_config": KIMI_QUANT},
                                                 indent=2))
    tsd = load_file(str(plain / "model.safetensors"))
    assert set(deq) <= set(tsd)
    save_file(tsd | deq, str(twin / "model.safetensors"), metadata={"format": "pt"})
    return int4, twin

