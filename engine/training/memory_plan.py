"""What one training step of a drafter holds in memory, computed on the meta device (no memory
used), and the packed-row size that fills a device: `--pack-tokens auto`.

Per device, for the trainer as engine/training/train.py builds it (fp32 weights, AdamW):
- held for the run: every trainable weight, its gradient and AdamW's two moments, the frozen
  target embedding (weights only); under FSDP each divided by the ranks, plus the whole drafter's
  weights and trainable gradients gathered for the forward and backward (one FSDP unit);
- per micro-batch: what autograd keeps for the backward (MEASURED by running the real
  `ttt_forward` at the shape under a saved-tensors hook, weights left out; fp32, an upper bound
  under bf16 autocast since norms and softmax statistics stay fp32), the loss's lm_head and state
  gradients plus one chunk of logits (engine/model/fused_ce.py), and the target side: its
  draft-vocab head rows, final hidden states and aux features.
Not counted: the CUDA context and the allocator's fragmentation: `auto_pack_tokens` leaves a
share of the device for them. The activations grow linearly with the tokens (the TTT attention
keeps no [T, T] tensor), so two measurements give the whole line.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.errors import EngineError
from engine.events import Emitter

GIB = 2**30
#: share of the free memory a packed row may plan for: the rest is the CUDA context, the
#: allocator's fragmentation and the data loader's pinned buffers
FILL = 0.8
#: packed rows are sized in steps of this many tokens, up to MAX_PACK (past 64k tokens a row, a
#: step's time grows with no gain in throughput, and a resumed plan's steps get coarse)
PACK_STEP, MAX_PACK = 1024, 65536


def activation_bytes(draft: Any, tokens: int, k: int, segments: torch.Tensor | None = None,
                     loss_rows: bool = True) -> int:
    """Bytes autograd keeps for the backward of `draft.ttt_forward` over one row of `tokens`,
    weights excluded: as the trainer calls it (loss_rows: every position a loss row, head=False),
    or the plain unroll to logits. A drafter on the meta device costs nothing to measure;
    `segments` measures packed samples."""
    weights = {t.untyped_storage()._cdata for t in [*draft.parameters(), *draft.buffers()]}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st._cdata not in weights:
            kept[st._cdata] = st.nbytes()  # one storage counted once, however many views
        return t

    dev = draft.fc.weight.device
    ht = draft.config.target_hidden_size or draft.config.hidden_size
    aux = torch.zeros(1, tokens, 3 * ht, device=dev)
    ids = torch.zeros(1, tokens, dtype=torch.long, device=dev)
    rows = [torch.arange(tokens - 2 - i, device=dev) for i in range(k)]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if loss_rows:
            draft.ttt_forward(aux, ids, k, rows=rows, head=False, segments=segments)
        else:
            draft.ttt_forward(aux, ids, k, segments=segments)
    return sum(kept.values())


def step_memory(cfg: Any, ranks: int, tokens: int, k: int, fsdp: bool = True) -> dict[str, float]:
    """One step's memory per device in GiB, by part (module docstring); `ranks` shard the
    weights under FSDP, and are ignored without it (each rank holds everything)."""
    from engine.model.draft import Eagle3Draft
    from engine.model.fused_ce import CHUNK_ELEMS
    with torch.device("meta"):
        draft = Eagle3Draft(cfg)
    frozen = draft.embed_tokens.weight.numel()
    trainable = sum(p.numel() for p in draft.parameters()) - frozen
    h, vd = cfg.hidden_size, cfg.draft_vocab_size
    ht = cfg.target_hidden_size or h
    held = 16 * trainable + 4 * frozen
    out = {
        "trainable_b": trainable / 1e9, "frozen_b": frozen / 1e9,
        "sharded": held / (ranks if fsdp else 1) / GIB,
        "gathered": (4 * (trainable + frozen) + 4 * trainable) / GIB if fsdp and ranks > 1
        else 0.0,
        "activations_fp32": activation_bytes(draft, tokens, k) / GIB,
        "loss": (4 * vd * h + 4 * k * tokens * h + 4 * CHUNK_ELEMS) / GIB,
        "target": 4 * (vd * ht + tokens * ht + 3 * tokens * ht) / GIB,
    }
    fixed = out["sharded"] + out["gathered"] + out["loss"] + out["target"]
    out["total_fp32"] = fixed + out["activations_fp32"]
    out["total_bf16_acts"] = fixed + out["activations_fp32"] / 2
    return out


def auto_pack_tokens(cfg: Any, k: int, free_bytes: int, ranks: int, fsdp: bool,
                     longest: int) -> int:
    """The largest packed row (a multiple of PACK_STEP tokens, at most MAX_PACK, at least the
    longest sample) whose step fits FILL of `free_bytes` by step_memory's fp32 count; one line
    naming the shortfall when not even the longest sample fits."""
    a, b = (step_memory(cfg, ranks, t, k, fsdp)["total_fp32"] * GIB for t in (1024, 2048))
    per_token = (b - a) / 1024
    fixed = a - 1024 * per_token
    budget = FILL * free_bytes
    fits = int((budget - fixed) // per_token) if budget > fixed else 0
    least = -(-longest // PACK_STEP) * PACK_STEP
    if fits < longest:
        need = (fixed + longest * per_token) / FILL / GIB
        raise EngineError(f"--pack-tokens auto: a step over the longest sample ({longest} tokens) "
                          f"needs about {need:.1f} GiB, the device has {free_bytes / GIB:.1f} GiB "
                          "free (use --fsdp over more ranks, --max-len, or a smaller K)")
    return max(least, min(MAX_PACK, fits // PACK_STEP * PACK_STEP)) if fits >= least \
        else longest


def resolve_pack(tc: Any, cfg: Any, device: torch.device, ranks: int, longest: int,
                 ck: dict[str, Any] | None, ev: Emitter) -> int | None:
    """The run's packed-row size from `--pack-tokens` (None: padded rows) for the drafter `cfg`.
    Unset: auto on a GPU, off on a CPU and with --online. Auto on a resumed run (`ck`, its last
    checkpoint) is the size the run recorded, so its plan does not move with the free memory."""
    asked = tc.pack_tokens
    if asked is None:
        asked = "auto" if device.type == "cuda" and not tc.online else "off"
    if asked == "off":
        return None
    if asked != "auto":
        return int(asked)
    recorded = ck["trainer"].get("settings", {}).get("pack_tokens") if ck is not None else None
    if isinstance(recorded, int):
        return recorded
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        import psutil
        free = psutil.virtual_memory().available
    n = auto_pack_tokens(cfg, tc.ttt_steps, free, ranks, tc.fsdp, longest)
    ev.log(f"--pack-tokens auto: {n} tokens a packed row ({free / GIB:.1f} GiB free)")
    return n
