"""A drafter swapped into a running vLLM: a weight-transfer backend that loads a drafter folder
already on the host, and the worker extension that registers it.

`serve` starts vLLM with

    VLLM_SERVER_DEV_MODE=1 vllm serve ...
        --worker-extension-cls engine.capture.swap_backend.SwapExtension
        --weight-transfer-config '{"backend": "eagle3_drafter_dir"}'

vLLM (0.32) checks the backend name in one place only: each worker's `load_model` asks
`WeightTransferEngineFactory.create_engine` for it (the API server and the engine core just carry
the string). The engine is on PYTHONPATH, not installed, so no entry point finds it; but every
worker resolves `--worker-extension-cls` (importing this module) in `init_worker`, before
`load_model`, in its own process (the engine core's for one GPU, each TP worker's otherwise):
importing the module registers the backend where it is looked up.

A swap is vLLM's own route sequence (`POST /start_draft_weight_update`, `/update_weights` with
`{"update_info": {"path": DIR}}`, `/finish_weight_update` with the weight version). Every rank
reads the whole drafter from its safetensors files and hands the tensors to the draft model's
own `load_weights`, whose weight loaders take each TP rank's shard exactly as vLLM's loader did
at start-up. Nothing of the running drafter is touched until every tensor has been read and
its name and shape matched against the drafter the server started with: a drafter that fails
there (missing, truncated, another shape) is refused and the old one keeps serving. Only then
does the backend start vLLM's layerwise reload (`initialize_layerwise_reload`, without which the
CPU backend refuses "Attempted to load weight ... into parameter (torch.Size([0]))") and
`finish_weight_update` finalizes it.

Imports of vLLM stay inside functions: the engine's import checks import this module where
vLLM is not installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.ckpt.safetensors_io import open_weights
from engine.errors import EngineError

BACKEND = "eagle3_drafter_dir"
EXTENSION = "engine.capture.swap_backend.SwapExtension"


@dataclass
class DirInitInfo:
    """Nothing to set up: the drafter is read from the host's disk."""


@dataclass
class DirUpdateInfo:
    """One swap: the drafter folder on the host (a vLLM-loadable export)."""

    path: str


def shapes(folder: str | Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's stored shape, from the validated headers (no data read)."""
    ws = open_weights(Path(folder))
    return {name: e.shape for name, e in ws.entries.items()}


def mismatch(new: dict[str, tuple[int, ...]], served: dict[str, tuple[int, ...]]) -> str | None:
    """Why a drafter with tensors `new` cannot replace one with `served`, or None."""
    missing = sorted(set(served) - set(new))
    extra = sorted(set(new) - set(served))
    if missing:
        return f"tensor {missing[0]!r} is missing ({len(missing)} of the served drafter's)"
    if extra:
        return f"tensor {extra[0]!r} is not in the served drafter"
    for name in sorted(served):
        if new[name] != served[name]:
            return f"tensor {name!r}: shape {list(new[name])}, the served drafter's " \
                   f"{list(served[name])}"
    return None


def read_drafter(folder: str, served: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """All of a drafter's tensors, read and checked against the served drafter's names and
    shapes (EngineError naming the file and tensor otherwise)."""
    ws = open_weights(Path(folder))
    why = mismatch({n: e.shape for n, e in ws.entries.items()}, served)
    if why:
        raise EngineError(f"{folder}: cannot replace the served drafter: {why}")
    return {name: ws.load(name) for name in ws.names()}


def _engine_class() -> type:
    from vllm.distributed.weight_transfer.base import WeightTransferEngine
    from vllm.model_executor.model_loader.reload import (
        finalize_layerwise_reload,
        initialize_layerwise_reload,
    )

    class DrafterDirEngine(WeightTransferEngine):
        """Loads a drafter folder on the host into the running draft model."""

        init_info_cls = DirInitInfo
        update_info_cls = DirUpdateInfo
        supports_draft_weight_update = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._reloading = False
            self._served: dict[str, dict[str, tuple[int, ...]]] = {}

        def init_transfer_engine(self, init_info: DirInitInfo) -> None:
            pass

        def start_weight_update(self) -> None:
            # the reload starts once the new drafter is read whole (receive_weights), so a
            # swap that stops before it leaves the serving drafter as it was
            self._reloading = False

        def _served_shapes(self) -> dict[str, tuple[int, ...]]:
            folder = str(self.model_config.model)  # the drafter vLLM started with
            if folder not in self._served:
                self._served[folder] = shapes(folder)
            return self._served[folder]

        def receive_weights(self, update_info: DirUpdateInfo) -> None:
            tensors = read_drafter(update_info.path, self._served_shapes())
            initialize_layerwise_reload(self.model)
            self._reloading = True
            self.model.load_weights(iter(tensors.items()))

        def finish_weight_update(self) -> None:
            if self._reloading:
                finalize_layerwise_reload(self.model, self.model_config)
                self._reloading = False

        def shutdown(self) -> None:
            pass

    return DrafterDirEngine


def register() -> bool:
    """Register the backend with vLLM in this process (idempotent); False without vLLM."""
    try:
        from vllm.distributed.weight_transfer import WeightTransferEngineFactory
    except ImportError:
        return False
    try:
        WeightTransferEngineFactory.register_engine(BACKEND, _engine_class())
    except ValueError:  # already registered in this process
        pass
    return True


class SwapExtension:
    """Mixed into every vLLM worker (`--worker-extension-cls`); importing this module is what
    registers the backend in that worker's process."""

    def eagle3_swap_backend(self) -> str:
        return BACKEND


register()
