"""How much disk captured target features take, and a refusal before writing when it won't fit.

Hidden states dominate: tokens x layers x hidden x dtype bytes. For a data
directory (engine/data/prepare.py) layers = 3 aux + 1 final = 4, plus 5 bytes a token for the int32
token id and the uint8 loss mask. Example: hidden 7168, bf16, 4 layers: ~57 KB per token, so 50k
conversations of 2k tokens need ~5.7 TB. Both capture paths (transformers and vLLM) call
`check_free_space` with `estimate_bytes` before they write anything.
"""

from __future__ import annotations

import os
import shutil

from engine.errors import EngineError

# bytes per token beside the hidden states in our shards: int32 input_ids + uint8 loss_mask
TOKEN_EXTRA_BYTES = 5


def estimate_bytes(tokens: int, layers: int, hidden: int, dtype_bytes: int,
                   extra_per_token: int = TOKEN_EXTRA_BYTES) -> int:
    """Bytes for `tokens` tokens of `layers` hidden states of width `hidden`."""
    return tokens * (layers * hidden * dtype_bytes + extra_per_token)


def human(n: float) -> str:
    """1234567 -> '1.2 MB' (decimal units, as df -H and disk vendors print them)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def free_bytes(path: str) -> int:
    """Free bytes on the filesystem that `path` (or its nearest existing parent) would be on."""
    p = os.path.abspath(path)
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return shutil.disk_usage(p).free


def check_free_space(out_path: str, need: int, keep_free: int = 0, what: str = "") -> int:
    """Raise EngineError, naming both figures, unless `need` bytes (+ `keep_free` headroom) fit on
    `out_path`'s filesystem; return the free bytes otherwise. `what` explains the estimate."""
    free = free_bytes(out_path)
    if need + keep_free > free:
        detail = f" ({what})" if what else ""
        head = f", keeping {human(keep_free)} free" if keep_free else ""
        raise EngineError(f"{out_path}: not enough disk space: the output needs about "
                          f"{human(need)}{detail}{head} but only {human(free)} is free")
    return free
