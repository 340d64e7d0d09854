"""Memory per GPU of one training step of a preset drafter under FSDP, computed (no GPU needed).

    python benchmarks/drafter_memory.py                 # kimi-k2-mla, kimi-k2, llama3-8b
    python benchmarks/drafter_memory.py --preset kimi-k2-mla --gpus 8 --tokens 8192 --k 7

What is counted, per GPU, for `torchrun --nproc-per-node N -m engine train --fsdp`, and how the
activations are measured (the real `ttt_forward` on the meta device): engine/training/
memory_plan.py, the same figures `--pack-tokens auto` sizes a packed row with. Not counted: the
CUDA context and the allocator's fragmentation (add 10-15%), the data loader.
"""

from __future__ import annotations

import argparse

from engine.model.presets import preset
from engine.training.memory_plan import step_memory


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", action="append", help="repeatable (default: the Kimi and Llama "
                    "presets)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=8192, help="tokens in one micro-batch")
    ap.add_argument("--k", type=int, default=7, help="TTT steps")
    a = ap.parse_args()
    print(f"per GPU, FSDP over {a.gpus} GPUs, {a.tokens} tokens a micro-batch, K={a.k} (GiB):")
    print(f"{'preset':12s} {'params (B)':>17s} {'sharded':>8s} {'gathered':>9s} "
          f"{'acts fp32':>10s} {'loss+tgt':>9s} {'total':>13s}")
    for name in a.preset or ["kimi-k2-mla", "kimi-k2", "llama3-8b"]:
        p = step_memory(preset(name), a.gpus, a.tokens, a.k)
        print(f"{name:12s} {p['trainable_b']:6.2f} + {p['frozen_b']:.2f} frozen "
              f"{p['sharded']:8.1f} {p['gathered']:9.1f} {p['activations_fp32']:10.1f} "
              f"{p['loss'] + p['target']:9.1f} {p['total_bf16_acts']:5.1f}-{p['total_fp32']:.1f}",
              flush=True)


if __name__ == "__main__":
    main()
