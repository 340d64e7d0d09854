"""A packed row's TTT unroll: the split attention (one causal kernel call per sample, no mask)
against the dense block-diagonal mask over all (i+1)T keys, side by side on the same row.

    python benchmarks/packed_attention.py                   # T=4096 of 8 samples, K=3
    python benchmarks/packed_attention.py --t 8192 --samples 16 --impls split

Each figure comes from a fresh process: seconds and the RSS high-water mark above the RSS before
(VmHWM, reset just before) for forward + backward of `ttt_forward` on one packed row, a Llama
draft layer of hidden 256 (4 heads of 64, 2 kv heads), every position's final-norm state summed
as the loss (the attention and its mask are what is measured, not the vocab). The dense mask
holds [T, (i+1)T] per step and SDPA's scores as many floats per head: it grows with K·T², the
split one with the samples' own lengths.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from loss_memory import _reset_peak, _status

REPO = Path(__file__).resolve().parent.parent


def one(impl: str, t: int, samples: int, k: int) -> dict[str, float]:
    import torch

    from engine.model.draft import Eagle3Draft, preset

    torch.manual_seed(0)
    cfg = preset("tiny").with_(hidden_size=256, intermediate_size=512, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=64, target_hidden_size=256,
                               vocab_size=1000, draft_vocab_size=100)
    draft = Eagle3Draft(cfg)
    draft.attn_impl = impl

    def run(t: int) -> tuple[int, float]:
        n = max(1, t // samples)
        seg = (torch.arange(t) // n).clamp(max=samples - 1)[None]
        aux = torch.randn(1, t, 3 * 256)
        ids = torch.randint(0, 1000, (1, t))
        before = _reset_peak()
        states = draft.ttt_forward(aux, ids, k, attention_mask=torch.ones_like(ids),
                                   head=False, segments=seg)
        loss = sum(s.float().sum() for s in states)
        loss.backward()  # type: ignore[union-attr]
        draft.zero_grad()
        return before, float(loss)

    run(64)
    t0 = time.perf_counter()
    before, loss = run(t)
    return {"impl": impl, "t": t, "seconds": round(time.perf_counter() - t0, 2),
            "peak_mib": (_status("VmHWM") - before) / 2**20, "loss": loss}


def measure(impl: str, t: int, samples: int, k: int) -> dict[str, float]:
    """`one` in a fresh process."""
    r = subprocess.run([sys.executable, __file__, "--one", impl, "--t", str(t), "--samples",
                        str(samples), "--k", str(k)], capture_output=True, text=True, cwd=REPO,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    if r.returncode != 0:
        raise SystemExit(f"{impl} at T={t}: {r.stderr.strip().splitlines()[-1:]}")
    out: dict[str, float] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", choices=("split", "dense"), help=argparse.SUPPRESS)
    ap.add_argument("--t", type=int, default=4096, help="the packed row's tokens")
    ap.add_argument("--samples", type=int, default=8, help="samples in the row (equal lengths)")
    ap.add_argument("--k", type=int, default=3, help="TTT steps")
    ap.add_argument("--impls", default="split,dense", help="of split, dense")
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.t, a.samples, a.k)))
        return
    got = {impl: measure(impl, a.t, a.samples, a.k) for impl in a.impls.split(",")}
    for impl, m in got.items():
        print(f"{impl:5s} T={a.t} samples={a.samples} K={a.k}: peak {m['peak_mib']:8.1f} MiB, "
              f"{m['seconds']:6.2f} s forward + backward", flush=True)
    if len(got) == 2:
        s, d = got["split"], got["dense"]
        same = abs(s["loss"] - d["loss"]) <= 1e-3 * max(1.0, abs(d["loss"]))
        print(f"split vs dense: {d['peak_mib'] / s['peak_mib']:.1f}x less memory, "
              f"{d['seconds'] / s['seconds']:.2f}x the speed; same loss: {same}")


if __name__ == "__main__":
    main()
