"""Peak memory of the training loss at a Kimi target's vocab: the fused lm_head + soft
cross-entropy the trainer runs (engine/model/fused_ce.py) against the plain one on full logits
(the lm_head, then `ttt_loss` with p from `target_distribution`), and the chunked target argmax.

    python benchmarks/loss_memory.py                      # T=8192 at V=163,840 and 32,000
    python benchmarks/loss_memory.py --t 8192 --vd 163840 --impls fused,argmax

Each figure comes from a fresh process: the RSS high-water mark (VmHWM, reset just before) over
the RSS then, for forward + backward of one step's loss over T positions (one TTT step, every
position supervised), hidden 16 so the matmuls stay cheap (their operands are O(T x H), the
[T, vocab] tensors are what is measured). The plain loss at V=163,840 and T=8192 needs several
[T,V] float32 tensors of 5 GiB each; it is run only where --impls names it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HIDDEN = 16


def _status(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def one(impl: str, t: int, vd: int, v: int, elems: int | None) -> dict[str, float]:
    """Forward + backward of `impl` in this process; its peak above the RSS before it (after
    a warm-up run at 16 tokens, so libraries' first-use buffers are not counted)."""
    import torch

    from engine.model.fused_ce import CHUNK_ELEMS, chunk_rows
    from engine.model.ttt_loss import (
        TargetSide,
        step_rows,
        target_argmax,
        target_distribution,
        ttt_loss,
        ttt_loss_fused,
    )

    torch.manual_seed(0)
    head = torch.randn(v if impl == "argmax" else vd, HIDDEN)  # the target's full head, or Vd rows
    w = torch.randn(vd, HIDDEN, requires_grad=True)
    d2t = torch.zeros(vd, dtype=torch.int64)  # identity vocab map: draft id i is target id i
    t2d = torch.ones(max(v, vd), dtype=torch.bool)

    last: list[float] = [0.0]  # the measured run's loss

    def run(t: int) -> int:
        hidden = torch.randn(1, t, HIDDEN)
        top = torch.randint(0, vd, (1, t))
        in_vocab = torch.ones(1, t, dtype=torch.bool)
        loss_mask = torch.ones(1, t, dtype=torch.long)
        rows = step_rows(loss_mask, in_vocab, 1)
        x = torch.randn(rows[0].numel(), HIDDEN, requires_grad=True)
        before = _reset_peak()
        if impl == "argmax":
            target_argmax(hidden, head)
            return before
        if impl == "fused":
            loss, _ = ttt_loss_fused([x], w, TargetSide(hidden, head, top, in_vocab), loss_mask,
                                     d2t, float(t), rows, chunk_rows(vd, elems or CHUNK_ELEMS))
        else:
            p, _ = target_distribution(hidden, head, top, t2d)
            loss, _ = ttt_loss([x @ w.T], p, top, in_vocab, loss_mask, d2t, float(t), rows)
        loss.backward()
        w.grad = None
        last[0] = float(loss.detach())
        return before

    run(16)
    t0 = time.perf_counter()
    before = run(t)
    return {"impl": impl, "t": t, "vd": vd, "seconds": round(time.perf_counter() - t0, 2),
            "peak_mib": (_status("VmHWM") - before) / 2**20,
            "loss": last[0]}


def _reset_peak() -> int:
    """Reset the RSS high-water mark to the RSS now; returns the RSS now (bytes)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        pass
    return _status("VmRSS")


def measure(impl: str, t: int, vd: int, v: int = 163_840, elems: int | None = None
            ) -> dict[str, float]:
    """`one` in a fresh process (a peak that earlier work in this one cannot hide)."""
    more = ["--chunk-elems", str(elems)] if elems else []
    r = subprocess.run([sys.executable, __file__, "--one", impl, "--t", str(t), "--vd", str(vd),
                        "--v", str(v), *more],
                       capture_output=True, text=True, cwd=REPO,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    if r.returncode != 0:
        raise SystemExit(f"{impl} at T={t}, Vd={vd}: {r.stderr.strip().splitlines()[-1:]}")
    out: dict[str, float] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", choices=("fused", "plain", "argmax"), help=argparse.SUPPRESS)
    ap.add_argument("--t", type=int, default=8192)
    ap.add_argument("--vd", type=int, action="append", help="draft vocab (repeatable)")
    ap.add_argument("--v", type=int, default=163_840, help="target vocab (the argmax's)")
    ap.add_argument("--impls", default="fused,argmax", help="of fused, plain, argmax")
    ap.add_argument("--chunk-elems", type=int,
                    help="the fused loss's values per chunk tensor (default: the trainer's)")
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.t, (a.vd or [a.v])[0], a.v, a.chunk_elems)))
        return
    for vd in a.vd or [163_840, 32_000]:
        for impl in a.impls.split(","):
            if impl == "argmax" and vd != (a.vd or [163_840])[0]:
                continue  # the argmax reads the target's whole vocab, whatever the draft's
            m = measure(impl, a.t, vd, a.v, a.chunk_elems)
            tv = 4 * a.t * vd / 2**20
            print(f"{impl:6s} T={a.t} Vd={vd:>7,} V={a.v:,}: peak {m['peak_mib']:8.1f} MiB "
                  f"({m['peak_mib'] / tv:.3f} of one [T,Vd] float32 tensor, {tv:,.0f} MiB), "
                  f"{m['seconds']} s", flush=True)


if __name__ == "__main__":
    main()
