"""The pieces both draft-layer kinds use (engine/model/draft.py's Llama layer and
engine/model/mla_layer.py): RMSNorm, RoPE tables (default, linear, llama3, yarn with mscale) and
their application, and the per-step (keys, values) type of the TTT unroll.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from engine.model.config import Eagle3Config

__all__ = ["KV", "RMSNorm", "apply_rope", "inv_freq", "rope_cos_sin"]

KV = tuple[Tensor, Tensor]  # one TTT step's keys, values [B,nkv,T,hd] after RoPE


class RMSNorm(nn.Module):
    """Llama RMSNorm, computed in float32 and cast back."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x32 = x.to(torch.promote_types(dtype, torch.float32))  # at least float32
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


# -- rotary position embedding --------------------------------------------------------------------

def inv_freq(cfg: Eagle3Config) -> tuple[Tensor, float]:
    """RoPE inverse frequencies [hd/2] and the attention scale factor (1.0 except for yarn)."""
    hd, base = cfg.head_dim, float(cfg.rope_theta)
    assert hd is not None
    freq = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))  # [hd/2]
    rs = cfg.rope_scaling
    kind = rs["rope_type"] if rs else "default"
    if kind == "linear":
        return (freq / rs["factor"]).float(), 1.0  # type: ignore[index]
    if kind == "llama3":
        assert rs is not None
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old_ctx = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / freq
        scaled = torch.where(wavelen > old_ctx / lo, freq / factor, freq)  # long waves: slowed
        smooth = (old_ctx / wavelen - lo) / (hi - lo)
        mid = (wavelen >= old_ctx / hi) & (wavelen <= old_ctx / lo)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        return torch.where(mid, blended, scaled).float(), 1.0
    if kind == "yarn":
        assert rs is not None
        return _yarn(cfg, rs, freq)
    return freq.float(), 1.0


def _yarn(cfg: Eagle3Config, rs: dict, freq: Tensor) -> tuple[Tensor, float]:
    """YaRN: interpolate long wavelengths, extrapolate short ones, ramp in between."""
    hd, base, factor = cfg.head_dim, float(cfg.rope_theta), float(rs["factor"])
    assert hd is not None
    orig = rs.get("original_max_position_embeddings") or cfg.max_position_embeddings

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = rs.get("attention_factor")
    if attn is None:
        if rs.get("mscale") and rs.get("mscale_all_dim"):
            attn = mscale(factor, rs["mscale"]) / mscale(factor, rs["mscale_all_dim"])
        else:
            attn = mscale(factor)

    def corr_dim(rot: float) -> float:
        return (hd * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    lo = max(math.floor(corr_dim(rs.get("beta_fast") or 32)), 0)
    hi: float = min(math.ceil(corr_dim(rs.get("beta_slow") or 1)), hd - 1)
    if lo == hi:
        hi += 0.001
    ramp = ((torch.arange(hd // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    extra = 1 - ramp  # 1: keep the original frequency, 0: interpolate
    out = (freq / factor) * (1 - extra) + freq * extra
    return out.float(), float(attn)


def rope_cos_sin(positions: Tensor, freqs: Tensor, scale: float, dtype: torch.dtype
                 ) -> tuple[Tensor, Tensor]:
    """cos/sin tables [B,T,hd] for integer positions [B,T] (HF rotate-half layout)."""
    work = torch.promote_types(torch.float32, dtype)  # float64 models get float64 tables
    ang = positions.to(work)[..., None] * freqs.to(positions.device, work)  # [B,T,hd/2]
    emb = torch.cat((ang, ang), dim=-1)  # [B,T,hd]
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [B,heads,T,hd]; cos/sin [B,T,hd]."""
    return x * cos[:, None] + _rotate_half(x) * sin[:, None]
