"""Distribution, set up in one place: a no-op without torchrun.

`maybe_init_dist()` reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK). Without it the
run is a single process and nothing is initialised. With it, the process group uses NCCL when CUDA
is available (one GPU per local rank) and gloo on CPU. Only rank 0 writes files and events.

    torchrun --nproc-per-node 8 -m engine train --target T --data D --out RUN
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import torch
import torch.distributed as torch_dist


@dataclass(frozen=True)
class Dist:
    """Where this process sits in the job."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        """True on the one process that writes files and events."""
        return self.rank == 0

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum across ranks in place (identity for one process)."""
        if self.enabled:
            torch_dist.all_reduce(t, op=torch_dist.ReduceOp.SUM)
        return t

    def barrier(self) -> None:
        if self.enabled:
            torch_dist.barrier()

    def broadcast_object(self, obj: object) -> object:
        """Rank 0's value of `obj` on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        torch_dist.broadcast_object_list(box, src=0)
        return box[0]


def maybe_init_dist(device: str | None = None) -> Dist:
    """Initialise the process group when launched by torchrun; otherwise a single-process Dist."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device:
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:  # set_device refuses a bare "cuda"
            dev = torch.device("cuda", local)
    elif torch.cuda.is_available():
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world > 1 and not torch_dist.is_initialized():
        torch_dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return Dist(rank=rank, world=world, local_rank=local, device=dev)


def shutdown(d: Dist) -> None:
    """Destroy the process group while the interpreter is whole. FSDP's modules, device mesh and
    DTensor states keep references to the group (and gloo's pending work to tensors) in reference
    cycles: collected only at interpreter exit, gloo's destructors then abort the process
    ("terminate called without an active exception", SIGABRT on a finished run). So: collect
    what the caller dropped, destroy the group, and collect again."""
    if d.enabled and torch_dist.is_initialized():
        gc.collect()
        torch_dist.destroy_process_group()
        gc.collect()
