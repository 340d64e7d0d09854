"""gpu_check's `ttt-attention` check: the trainer's split TTT attention (engine/model/
ttt_attention.py) against the dense masked reference, forward and backward, on the device.

On CUDA the step-0 block runs PyTorch's memory-efficient kernel and its backward is given the
MERGED output of all TTT steps. That kernel reads `out` assuming the layout its own forward
writes ([B, T, nh, hd] in memory): handed a [B, nh, T, hd]-contiguous tensor it read past the
end of it (an illegal memory access at T=2048 with 7 TTT steps; wrong gradients where it did not
fault). Only a GPU runs that path, so this check compares every gradient with a float64 dense
reference computed on the same device, at the llama3-8b head shape, for steps without and with
diagonal keys, in bf16 and float32.
"""

from __future__ import annotations

import time
from typing import Any

# (T, diagonal steps, dtype name): TTT step 0, a middle step and the last of K = 7
GPU_CASES = ((2048, 0, "bfloat16"), (2048, 2, "bfloat16"), (2048, 6, "bfloat16"),
             (333, 3, "float32"))
CPU_CASES = ((96, 0, "float32"), (96, 3, "float32"))
TOL = {"bfloat16": 3e-2, "float32": 1e-4}


def _grads(fn: Any, base: list[Any], g: Any, n: int, dtype: Any) -> list[Any]:
    xs = [x.detach().clone().to(dtype).requires_grad_(True) for x in base]
    diag = [(xs[3 + 2 * j], xs[4 + 2 * j]) for j in range(n)]
    out = fn(xs[0], xs[1], xs[2], diag)
    out.backward(g.to(dtype))
    return [out.detach().double()] + [x.grad.double() for x in xs]


def check_ttt_attention(cpu: bool) -> dict[str, Any]:
    import torch

    from engine.model.ttt_attention import dense_reference, split_attention

    if not cpu and not torch.cuda.is_available():
        return {"status": "fail", "reason": "no CUDA device"}
    dev = "cpu" if cpu else "cuda"
    b, nh, nkv, hd = 1, 32, 8, 128
    worst: dict[str, float] = {}
    t0 = time.perf_counter()
    for t, n, dname in CPU_CASES if cpu else GPU_CASES:
        gen = torch.Generator(device="cpu").manual_seed(t + n)
        shapes = [(b, nh, t, hd), (b, nkv, t, hd), (b, nkv, t, hd)] + [(b, nkv, t, hd)] * (2 * n)
        base = [torch.randn(*s, generator=gen).to(dev) for s in shapes]
        g = torch.randn(b, nh, t, hd, generator=gen).to(dev)
        ref = _grads(dense_reference, base, g, n, torch.float64)
        got = _grads(split_attention, base, g, n, getattr(torch, dname))
        if dev == "cuda":
            torch.cuda.synchronize()
        names = ["out", "dq", "dk0", "dv0"] + [f"d{'kv'[j % 2]}{1 + j // 2}" for j in range(2 * n)]
        rel = max((float((a - e).abs().max() / e.abs().max().clamp_min(1e-12)), name)
                  for a, e, name in zip(got, ref, names, strict=True))
        case = f"T{t}-n{n}-{dname}"
        worst[case] = float(f"{rel[0]:.3g}")
        if not rel[0] <= TOL[dname]:
            return {"status": "fail", "reason": f"{case}: {rel[1]} rel diff {rel[0]:.3g} "
                                                f"vs the dense reference (tol {TOL[dname]})",
                    "worst_rel": worst}
    return {"status": "ok", "device": dev if cpu else torch.cuda.get_device_name(0),
            "cases": len(worst), "worst_rel": max(worst.values()), "per_case": worst,
            "check_s": round(time.perf_counter() - t0, 1)}
