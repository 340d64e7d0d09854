"""TTT attention (training-time test) without the dense mask.

At TTT step i a query at position t attends to the step-0 keys at positions <= t (causal) and to
the key of every later step j = 1..i at the SAME position t; one softmax over all of them. The
dense formulation concatenates (i+1)T keys and masks a [T, (i+1)T] score matrix. Here:

- the step-0 part is one causal flash-style attention that also returns its log-sum-exp
  (`causal_attention`: the CPU flash kernel, the CUDA memory-efficient kernel; no [T,T] tensor);
- the diagonal part is i elementwise scores q.k_j per position;
- the two are merged with their log-sum-exps: lse = logaddexp(lse_0, s_1, .., s_i),
  out = exp(lse_0 - lse) * out_0 + sum_j exp(s_j - lse) * v_j.

The backward is the flash-attention merge rule: the step-0 kernel's own backward, given the MERGED
output and log-sum-exp, returns exactly the step-0 block's share of dq, dk, dv (its probabilities
are exp(s - lse) and its correction term rowsum(dout * out) is the merged one); the diagonal part
is done here elementwise. Grouped-query attention: keys/values have nkv heads, queries nh.
The softmax scale is 1/sqrt(hd) unless given (MLA: 1/sqrt(qk head width) times yarn's mscale^2,
with q/k/v zero-padded to one width by the caller, engine/model/mla_layer.py).

Packed rows (several samples in one row, engine/model/packing.py) give `spans`: the step-0 block
is then one causal kernel call per sample, written into its slice of out and lse, and the merge
above is unchanged (a later step's key is at the query's own position, always its own sample).

`split_attention(q, k0, v0, diag, causal)` is the entry point; `dense_reference` is the masked
SDPA over concatenated keys that it replaces (kept for tests and as the fallback).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.model.packing import Spans

__all__ = ["causal_attention", "dense_reference", "split_attention"]


def _expand(x: Tensor, rep: int) -> Tensor:
    """[B,nkv,T,hd] -> [B,nkv*rep,T,hd] (head n reads kv head n // rep)."""
    return x if rep == 1 else x.repeat_interleave(rep, dim=1)


def _reduce(x: Tensor, rep: int) -> Tensor:
    """Gradient of `_expand`: [B,nkv*rep,T,hd] -> [B,nkv,T,hd]."""
    if rep == 1:
        return x
    b, nh, t, hd = x.shape
    return x.view(b, nh // rep, rep, t, hd).sum(2)


# -- the step-0 kernel: (out, lse) forward, merged-output backward ---------------------------------

def _math_scores(q: Tensor, k: Tensor, causal: bool, scale: float) -> tuple[Tensor, torch.dtype]:
    """Scaled scores q·k in at least float32 (causal: upper triangle -inf), and that dtype."""
    work = torch.promote_types(q.dtype, torch.float32)
    s = (q.to(work) @ k.to(work).transpose(-1, -2)) * scale
    if causal:
        tq, tk = s.shape[-2:]
        keep = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return s, work


def _math_fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    s, work = _math_scores(q, k, causal, scale)
    lse = s.logsumexp(-1)
    p = torch.exp(s - lse[..., None])
    return (p @ v.to(work)).to(v.dtype), lse


def _math_bwd(g: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, causal: bool,
              scale: float) -> tuple[Tensor, Tensor, Tensor]:
    s, work = _math_scores(q, k, causal, scale)
    p = torch.exp(s - lse.to(work)[..., None])
    gw = g.to(work)
    dv = p.transpose(-1, -2) @ gw
    dp = gw @ v.to(work).transpose(-1, -2)
    d = (gw * out.to(work)).sum(-1, keepdim=True)
    ds = p * (dp - d) * scale
    return (ds @ k.to(work)).to(q.dtype), (ds.transpose(-1, -2) @ q.to(work)).to(k.dtype), \
        dv.to(v.dtype)


def _use_kernel(q: Tensor) -> str:
    if q.device.type == "cpu":
        return "cpu_flash"
    if q.device.type == "cuda":
        return "cuda_efficient"
    return "math"


def causal_fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float
               ) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
    """Attention of q [B,nh,Tq,hd] over k, v [B,nh,Tk,hd] (same heads): (out [B,nh,Tq,hd],
    lse [B,nh,Tq] float32 or float64, extra state for `causal_bwd`)."""
    kind = _use_kernel(q)
    if kind == "cpu_flash":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, scale=scale)
        return out, lse, ()
    if kind == "cuda_efficient":
        out, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, None, True, 0.0, causal, scale=scale)
        return out, lse[..., :q.shape[2]], (lse, seed, offset)
    out, lse = _math_fwd(q, k, v, causal, scale)
    return out, lse, ()


def causal_bwd(g: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
               extra: tuple[Tensor, ...], causal: bool, scale: float
               ) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv of the block `causal_fwd` computed, given the (merged) out and lse."""
    kind = _use_kernel(q)
    if kind == "cpu_flash":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            g.contiguous(), q, k, v, out, lse.contiguous(), 0.0, causal, scale=scale)
    if kind == "cuda_efficient":
        full, seed, offset = extra
        lse_full = full.clone()
        lse_full[..., :lse.shape[-1]] = lse
        # The kernel reads `out` in the layout its forward writes, [B,T,nh,hd] in memory (its
        # row stride is taken as nh*hd whatever out's strides say): the merged output is
        # [B,nh,T,hd]-contiguous, and handed over as it is, it was read past its end (an
        # illegal memory access at T=2048, wrong gradients below that). benchmarks/
        # gpu_check_ttt.py checks every gradient against the dense reference on a GPU.
        out = out.transpose(1, 2).contiguous().transpose(1, 2)
        dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            g.contiguous(), q, k, v, None, out, lse_full, seed, offset, 0.0,
            [True, True, True, False], causal, scale=scale)
        return dq, dk, dv
    return _math_bwd(g, q, k, v, out, lse, causal, scale)


def causal_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = True,
                     scale: float | None = None) -> tuple[Tensor, Tensor]:
    """Forward only: (out, lse) of (causal) attention; q, k, v with equal head counts."""
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out, lse, _ = causal_fwd(q.contiguous(), k.contiguous(), v.contiguous(), causal, sc)
    return out, lse


def blocks_fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, spans: Spans | None
               ) -> tuple[Tensor, Tensor, tuple[object, ...]]:
    """`causal_fwd`, or with `spans` one call per sample's slice (no key outside its sample)."""
    if spans is None:
        return causal_fwd(q, k, v, causal, scale)
    out = torch.zeros_like(q)
    lse: Tensor | None = None
    extras = []
    for r, a, z in spans.items:
        qs, ks, vs = (t[r:r + 1, :, a:z].contiguous() for t in (q, k, v))
        o, m, x = causal_fwd(qs, ks, vs, causal, scale)
        if lse is None:
            lse = torch.zeros(q.shape[:3], dtype=m.dtype, device=q.device)
        out[r:r + 1, :, a:z] = o
        lse[r:r + 1, :, a:z] = m
        extras.append(x)
    assert lse is not None, "spans cover no position"
    return out, lse, tuple(extras)


def blocks_bwd(g: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
               extra: tuple[object, ...], causal: bool, scale: float, spans: Spans | None
               ) -> tuple[Tensor, Tensor, Tensor]:
    """`causal_bwd` of what `blocks_fwd` computed (given the merged out and lse)."""
    if spans is None:
        return causal_bwd(g, q, k, v, out, lse, extra, causal, scale)  # type: ignore[arg-type]
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for (r, a, z), x in zip(spans.items, extra, strict=True):
        gs, qs, ks, vs, os_, ls = (t[r:r + 1, :, a:z].contiguous()
                                   for t in (g, q, k, v, out, lse))
        gq, gk, gv = causal_bwd(gs, qs, ks, vs, os_, ls, x, causal, scale)  # type: ignore[arg-type]
        dq[r:r + 1, :, a:z] = gq
        dk[r:r + 1, :, a:z] = gk
        dv[r:r + 1, :, a:z] = gv
    return dq, dk, dv


# -- the merge -------------------------------------------------------------------------------------

class _SplitAttention(torch.autograd.Function):
    """forward(causal, scale, spans, q, k0, v0, k1, v1, .., ki, vi) -> out [B,nh,T,hd] (module
    docstring; scale None: 1/sqrt(hd); spans None: one sample per row)."""

    @staticmethod
    def forward(ctx, causal: bool, scale: float | None, spans: Spans | None, q: Tensor,
                k0: Tensor, v0: Tensor, *diag: Tensor) -> Tensor:
        b, nh, t, hd = q.shape
        nkv = k0.shape[1]
        rep = nh // nkv
        scale = 1.0 / math.sqrt(hd) if scale is None else scale
        q = q.contiguous()
        k0e, v0e = _expand(k0, rep).contiguous(), _expand(v0, rep).contiguous()
        out0, lse0, extra = blocks_fwd(q, k0e, v0e, causal, scale, spans)
        work = lse0.dtype
        ks, vs = diag[0::2], diag[1::2]
        if ks:
            qg = q.view(b, nkv, rep, t, hd).to(work)  # bf16 inputs: the scores in float32
            s = torch.stack([(qg * kj[:, :, None].to(work)).sum(-1) for kj in ks]) * scale
            # s: [n, B, nkv, rep, T]
            lse = torch.logaddexp(lse0.view(b, nkv, rep, t), s.logsumexp(0))  # [B,nkv,rep,T]
            w0 = torch.exp(lse0.view(b, nkv, rep, t) - lse)
            ps = torch.exp(s - lse)  # [n,B,nkv,rep,T]
            acc = w0[..., None] * out0.view(b, nkv, rep, t, hd).to(work)
            for pj, vj in zip(ps, vs, strict=True):
                acc = acc + pj[..., None] * vj[:, :, None].to(work)
            out = acc.to(q.dtype).view(b, nh, t, hd)
            lse = lse.reshape(b, nh, t)
        else:
            out, lse, s = out0, lse0, None
        ctx.causal, ctx.rep, ctx.scale, ctx.n = causal, rep, scale, len(ks)
        ctx.extra, ctx.spans = extra, spans
        ctx.save_for_backward(q, k0e, v0e, out, lse, *diag,
                              *(() if s is None else (s,)))
        return out

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, ...]:
        q, k0e, v0e, out, lse, *rest = ctx.saved_tensors
        n, rep, scale = ctx.n, ctx.rep, ctx.scale
        diag = rest[:2 * n]
        g = g.contiguous()
        dq, dk0, dv0 = blocks_bwd(g, q, k0e, v0e, out, lse, ctx.extra, ctx.causal, scale,
                                  ctx.spans)
        dk0, dv0 = _reduce(dk0, rep), _reduce(dv0, rep)
        grads: list[Tensor] = []
        if n:
            s = rest[2 * n]
            b, nh, t, hd = q.shape
            nkv = nh // rep
            work = lse.dtype
            gg = g.view(b, nkv, rep, t, hd).to(work)
            qg = q.view(b, nkv, rep, t, hd).to(work)
            lse_g = lse.view(b, nkv, rep, t)
            d = (gg * out.view(b, nkv, rep, t, hd).to(work)).sum(-1)  # [B,nkv,rep,T]
            dqw = dq.view(b, nkv, rep, t, hd).to(work)
            for j in range(n):
                kj, vj = diag[2 * j].to(work), diag[2 * j + 1].to(work)
                pj = torch.exp(s[j] - lse_g)  # [B,nkv,rep,T]
                dp = (gg * vj[:, :, None]).sum(-1)
                ds = pj * (dp - d) * scale
                dqw = dqw + ds[..., None] * kj[:, :, None]
                grads.append((ds[..., None] * qg).sum(2).to(diag[2 * j].dtype))
                grads.append((pj[..., None] * gg).sum(2).to(diag[2 * j + 1].dtype))
            dq = dqw.to(q.dtype).view(b, nh, t, hd)
        return (None, None, None, dq, dk0, dv0, *grads)


def split_attention(q: Tensor, k0: Tensor, v0: Tensor, diag: list[tuple[Tensor, Tensor]],
                    causal: bool = True, scale: float | None = None,
                    spans: Spans | None = None) -> Tensor:
    """q [B,nh,T,hd]; k0, v0 [B,nkv,T0,hd] the step-0 keys (causal when `causal`, else all of
    them for every query); diag: (k, v) [B,nkv,T,hd] of steps 1..i at the query's own position.
    Returns [B,nh,T,hd], the one-softmax attention over all of them (softmax scale `scale`,
    None: 1/sqrt(hd)). `spans`: packed rows, the step-0 keys of a query's own sample only."""
    flat = [x for kv in diag for x in kv]
    if spans is not None:
        return _packed(causal, scale, spans, q, k0, v0, *flat)
    return _SplitAttention.apply(causal, scale, None, q, k0, v0, *flat)


@torch.compiler.disable
def _packed(causal: bool, scale: float | None, spans: Spans, *tensors: Tensor) -> Tensor:
    """Outside any compiled graph: traced, the per-sample loop would be one graph per batch's
    sample lengths (a recompile every step); eager, it is a few kernel calls per sample."""
    return _SplitAttention.apply(causal, scale, spans, *tensors)


def dense_reference(q: Tensor, k0: Tensor, v0: Tensor, diag: list[tuple[Tensor, Tensor]],
                    causal: bool = True, scale: float | None = None) -> Tensor:
    """The same attention the old way: concatenated keys, a dense bool mask, SDPA."""
    b, nh, t, hd = q.shape
    rep = nh // k0.shape[1]
    t0 = k0.shape[2]
    keys = torch.cat([k0] + [k for k, _ in diag], dim=2)
    vals = torch.cat([v0] + [v for _, v in diag], dim=2)
    keys, vals = _expand(keys, rep), _expand(vals, rep)
    first = torch.ones(t, t0, dtype=torch.bool, device=q.device)
    if causal:
        first = first.tril()
    eye = torch.eye(t, dtype=torch.bool, device=q.device)
    mask = torch.cat([first] + [eye] * len(diag), dim=-1)
    return F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask, scale=scale)
