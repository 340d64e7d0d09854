"""Will the features fit? The output size of a capture, estimated before any of it is computed.

A data directory holds, per token, the three aux hidden states and the final hidden state (4 x Ht
values of the stored dtype) plus its id (int32) and loss-mask byte. For a Kimi-K2 class target
(Ht 7168, bf16) that is 4 x 7168 x 2 = ~57 KB per token: 50k conversations of 2k tokens are
~5.7 TB. Both capture paths (transformers and vLLM) refuse to start when the output's filesystem
cannot hold the estimate, naming the estimate, its arithmetic and the free space.
"""

from __future__ import annotations

import os
import shutil

from engine.errors import EngineError

FEATURE_SLOTS = 4  # three aux hidden states + the final hidden state
TOKEN_BYTES = 5  # input_ids int32 + loss_mask uint8


def estimate_bytes(tokens: int, hidden_size: int, dtype_bytes: int) -> int:
    """Bytes the shards of `tokens` tokens take (safetensors headers aside)."""
    return tokens * (FEATURE_SLOTS * hidden_size * dtype_bytes + TOKEN_BYTES)


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def free_bytes(path: str) -> tuple[str, int]:
    """(the nearest existing directory at or above `path`, the free bytes of its filesystem)."""
    probe = os.path.abspath(path)
    while not os.path.isdir(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    return probe, shutil.disk_usage(probe).free


def check_space(out_dir: str, tokens: int, hidden_size: int, dtype_bytes: int,
                spare: int = 0) -> int:
    """Raise when OUT's filesystem cannot hold the estimate (+ `spare`); returns the estimate."""
    need = estimate_bytes(tokens, hidden_size, dtype_bytes)
    where, free = free_bytes(out_dir)
    if need + spare > free:
        raise EngineError(
            f"{out_dir}: the features need about {human(need + spare)} ({tokens} tokens x "
            f"{FEATURE_SLOTS} hidden states x {hidden_size} x {dtype_bytes} bytes"
            + (f" + {human(spare)} for the server's files in flight" if spare else "")
            + f") but {where} has {human(free)} free; free some space, capture fewer "
            "conversations, or train streamed (engine train --online --from-vllm)")
    return need
