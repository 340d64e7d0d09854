"""Memory per GPU of one training step of a preset drafter under FSDP, computed (no GPU needed).

    python benchmarks/drafter_memory.py                 # kimi-k2-mla, kimi-k2, llama3-8b
    python benchmarks/drafter_memory.py --preset kimi-k2-mla --gpus 8 --tokens 8192 --k 7

What is counted, per GPU, for `torchrun --nproc-per-node N -m engine train --fsdp` as the trainer
builds it (engine/training/train.py: `fully_shard` on the whole unroll, fp32 weights, AdamW, bf16
autocast on CUDA):
- sharded: every weight, its gradient and AdamW's two moments (trainable), the frozen target
  embedding (weights only), each divided by N;
- gathered: the whole drafter's fp32 weights, all-gathered for the forward and the backward (one
  FSDP unit), and the trainable gradients before their reduce-scatter;
- activations: what autograd keeps for the backward over one micro-batch of `--tokens` tokens,
  MEASURED on the meta device by running the real `ttt_forward` at the preset's shape (no memory
  used) under a saved-tensors hook, weights left out; shown in fp32 and halved as the bf16
  autocast upper bound does not hold for every tensor (norms and softmax statistics stay fp32);
- the loss (engine/model/fused_ce.py): the lm_head gradient and the states' gradient it makes in
  the forward, plus one chunk of logits;
- the target side of the micro-batch: its draft-vocab head rows, final hidden states and the aux
  features.
Not counted: the CUDA context and the allocator's fragmentation (add 10-15%), the data loader.
The activations grow linearly with tokens (the TTT attention keeps no [T, T] tensor) and with K.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

GIB = 2**30


def activation_bytes(cfg: Any, tokens: int, k: int) -> int:
    """Bytes autograd saves for the backward of `ttt_forward` (head=False, every position a loss
    row) at this shape, fp32, weights excluded: measured on the meta device."""
    from engine.model.draft import Eagle3Draft
    with torch.device("meta"):
        draft = Eagle3Draft(cfg)
    weights = {t.untyped_storage()._cdata for t in [*draft.parameters(), *draft.buffers()]}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st._cdata not in weights:
            kept[st._cdata] = st.nbytes()  # one storage counted once, however many views
        return t

    ht = cfg.target_hidden_size or cfg.hidden_size
    aux = torch.empty(1, tokens, 3 * ht, device="meta")
    ids = torch.zeros(1, tokens, dtype=torch.long, device="meta")
    rows = [torch.arange(tokens - 2 - i, device="meta") for i in range(k)]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        draft.ttt_forward(aux, ids, k, rows=rows, head=False)
    return sum(kept.values())


def plan(name: str, gpus: int, tokens: int, k: int) -> dict[str, float]:
    """The figures of the module docstring, in GiB."""
    from engine.model.draft import Eagle3Draft
    from engine.model.fused_ce import CHUNK_ELEMS
    from engine.model.presets import preset
    cfg = preset(name)
    with torch.device("meta"):
        draft = Eagle3Draft(cfg)
    frozen = draft.embed_tokens.weight.numel()
    trainable = sum(p.numel() for p in draft.parameters()) - frozen
    h, vd = cfg.hidden_size, cfg.draft_vocab_size
    ht = cfg.target_hidden_size or h
    acts = activation_bytes(cfg, tokens, k)
    out = {
        "trainable_b": trainable / 1e9, "frozen_b": frozen / 1e9,
        "sharded": (16 * trainable + 4 * frozen) / gpus / GIB,
        "gathered": (4 * (trainable + frozen) + 4 * trainable) / GIB,
        "activations_fp32": acts / GIB,
        "loss": (4 * vd * h + 4 * k * tokens * h + 4 * CHUNK_ELEMS) / GIB,
        "target": 4 * (vd * ht + tokens * ht + 3 * tokens * ht) / GIB,
    }
    fixed = out["sharded"] + out["gathered"] + out["loss"] + out["target"]
    out["total_fp32"] = fixed + out["activations_fp32"]
    out["total_bf16_acts"] = fixed + out["activations_fp32"] / 2
    return out


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
        p = plan(name, a.gpus, a.tokens, a.k)
        print(f"{name:12s} {p['trainable_b']:6.2f} + {p['frozen_b']:.2f} frozen "
              f"{p['sharded']:8.1f} {p['gathered']:9.1f} {p['activations_fp32']:10.1f} "
              f"{p['loss'] + p['target']:9.1f} {p['total_bf16_acts']:5.1f}-{p['total_fp32']:.1f}",
              flush=True)


if __name__ == "__main__":
    main()
