"""Trainer checkpoints: RUN_DIR/checkpoints/step_NNNNNN/, atomic, a `latest` pointer, keep K.

One checkpoint directory holds
    config.json        the drafter's EAGLE-style config (the directory loads like any drafter:
    model.safetensors  `eval --draft RUN/checkpoints/step_000500` works)
    optimizer.pt       AdamW state (tensors and plain containers; loaded with weights_only=True)
    trainer.json       step, data position (epoch, step in epoch), scheduler state, best tau so
                       far, world size, the run settings that must match on --resume
    rng.pt             torch CPU (and CUDA) generator states per rank (weights_only=True)
It is written to `.tmp-step_NNNNNN-PID` and renamed (engine/fileio.py's atomic_dir); `latest`
(a one-line file naming the directory) is replaced after the rename, so a crash at any point
leaves the previous checkpoint as `latest`. Older step directories beyond the last K are deleted
after that.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from engine.errors import EngineError
from engine.fileio import atomic_dir, json_text, read_json, reason, write_text

STEP_DIR = re.compile(r"^step_(\d{6,})$")
STALE_OLD = re.compile(r"^\.step_\d{6,}\.old-\d+-[0-9a-f]{8}$")


def step_name(step: int) -> str:
    return f"step_{step:06d}"


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    """A file inside the checkpoint's temp dir (the directory as a whole is atomic)."""
    path.write_text(json_text(obj), encoding="utf-8")


def save_checkpoint(ckpt_root: Path, step: int, draft_config: dict[str, Any],
                    model_state: dict[str, torch.Tensor], optimizer_state: dict[str, Any],
                    trainer_state: dict[str, Any], rng_states: list[dict[str, Any]],
                    keep: int) -> Path:
    """Write one checkpoint atomically, point `latest` at it, prune to the last `keep`."""
    from safetensors.torch import save_file
    ckpt_root.mkdir(parents=True, exist_ok=True)
    final = ckpt_root / step_name(step)
    tmp = ckpt_root / f".tmp-{step_name(step)}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    writers: list[tuple[str, Callable[[Path], None]]] = [
        ("config.json", lambda p: _write_json(p, draft_config)),
        ("model.safetensors", lambda p: save_file(
            {k: v.detach().cpu().contiguous() for k, v in model_state.items()}, str(p),
            metadata={"format": "pt"})),
        ("optimizer.pt", lambda p: torch.save(optimizer_state, p)),
        ("rng.pt", lambda p: torch.save(rng_states, p)),
        ("trainer.json", lambda p: _write_json(p, trainer_state))]
    current = final
    try:  # a rerun of the same step after a crash replaces it (once the new one is complete)
        with atomic_dir(final, tmp) as out:
            for name, write in writers:
                current = final / name
                write(out / name)
        current = ckpt_root / "latest"
        write_text(current, final.name + "\n")
    except (OSError, RuntimeError) as e:  # torch.save words a full disk as a RuntimeError
        why = reason(e) if isinstance(e, OSError) else "the write failed"
        raise EngineError(f"{current}: cannot write the checkpoint ({why}; is the disk full?); "
                          f"the previous checkpoint stays the latest") from None
    prune(ckpt_root, keep)
    return final


def step_dirs(ckpt_root: Path) -> list[Path]:
    """Complete step directories, oldest first."""
    if not ckpt_root.is_dir():
        return []
    found = [p for p in ckpt_root.iterdir() if p.is_dir() and STEP_DIR.match(p.name)]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def prune(ckpt_root: Path, keep: int) -> None:
    """Delete all but the newest `keep` step dirs (never the one `latest` names), and temp dirs."""
    latest = latest_dir(ckpt_root)
    dirs = step_dirs(ckpt_root)
    for p in dirs[:-keep] if keep > 0 else dirs:
        if latest is None or p.resolve() != latest.resolve():
            shutil.rmtree(p, ignore_errors=True)
    for p in ckpt_root.iterdir():
        if p.name.startswith(".tmp-step_") and not p.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(p, ignore_errors=True)  # left by a killed run
        elif STALE_OLD.match(p.name):  # a replaced step a killed run had moved aside
            shutil.rmtree(p, ignore_errors=True)


def latest_dir(ckpt_root: Path) -> Path | None:
    """The directory `latest` points at, or None when there is no checkpoint yet."""
    pointer = ckpt_root / "latest"
    if not pointer.is_file():
        return None
    name = pointer.read_text(encoding="utf-8").strip()
    if not STEP_DIR.match(name) or not (ckpt_root / name).is_dir():
        raise EngineError(f"{pointer}: names {name!r}, which is not a checkpoint directory")
    return ckpt_root / name


def load_checkpoint(path: Path) -> dict[str, Any]:
    """model (state dict), optimizer, trainer, rng of one checkpoint directory."""
    from safetensors.torch import load_file
    for name in ("model.safetensors", "optimizer.pt", "trainer.json", "rng.pt"):
        if not (path / name).is_file():
            raise EngineError(f"{path}: {name} is missing (incomplete checkpoint)")
    trainer = read_json(path / "trainer.json")
    try:
        model = load_file(str(path / "model.safetensors"))
    except Exception as e:  # SafetensorError: truncated, bad header
        raise EngineError(f"{path / 'model.safetensors'}: not a readable safetensors file "
                          f"({str(e).splitlines()[0][:120]})") from None
    return {"model": model, "optimizer": _load_pt(path / "optimizer.pt"),
            "rng": _load_pt(path / "rng.pt"), "trainer": trainer}


def _load_pt(path: Path) -> Any:
    """A torch file of tensors and plain containers (weights_only: never a pickle's code)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # not a zip, refused globals, truncated
        raise EngineError(f"{path}: not a loadable weights-only torch file "
                          f"({str(e).splitlines()[0][:120]})") from None


def check_optimizer_state(opt: torch.optim.Optimizer, path: Path) -> None:
    """After loading: every per-parameter state tensor has its parameter's shape (a tampered or
    foreign optimizer.pt would otherwise fail at the first step with a bare size error)."""
    params = [p for g in opt.param_groups for p in g["params"]]
    for i, p in enumerate(params):
        for key, t in opt.state.get(p, {}).items():
            if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape != p.shape:
                raise EngineError(f"{path}: tensor {key!r} of parameter {i} has shape "
                                  f"{list(t.shape)}, the drafter's parameter is {list(p.shape)}")


def rng_state() -> dict[str, Any]:
    """This process's generator states."""
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
