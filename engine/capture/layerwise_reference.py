"""The reference check's forward for a target too big for this host: one decoder layer in memory
at a time (engine/capture/reference_check.py, mode `layers`).

The target's causal LM is built on the meta device from its (text) config, so every layer is
transformers' own class for that index (DeepSeek-V3's dense first layers and MoE layers alike)
and the model's own forward runs: its embedding, rotary embedding, causal mask and layer calls.
Only the weights are streamed: the embedding before the forward, and each decoder layer's
tensors just before that layer runs (a forward pre-hook), read from the safetensors files
(engine/ckpt/safetensors_io.py) and released after it (a forward hook moves them back to meta).
Peak memory is the embedding plus the largest layer in float32, whatever the layer count.
Layers past the highest captured id are never read: the forward stops once the states at every
id are taken (id N, the last layer's output, needs all N layers; the final norm never).

A layer's stored tensors go through transformers' own loading step
(`convert_and_load_state_dict_in_model` with the model's conversion mapping), the step
from_pretrained takes: it renames a wrapper's `language_model.*` keys (the layout's key_mapping)
and fuses the per-expert checkpoint tensors (`mlp.experts.<e>.gate_proj/up_proj/down_proj`) into
the fused in-memory parameters transformers 5 keeps (`mlp.experts.gate_up_proj`, `down_proj`), so
this forward computes what the `full` mode's from_pretrained model computes.

Int4 experts in compressed-tensors' `pack-quantized` format (Kimi-K2.5's routed experts:
`…experts.<e>.gate_proj.weight_packed` + `weight_scale` + `weight_shape`) are dequantised to
float32 `…weight` tensors (engine/ckpt/int4_packed.py) as each layer is read, before that step, so
they load as ordinary weights; one layer is dequantised at a time, never the model. Any other
quantisation scheme is refused by config.json's field, and a layer whose parameters are not all in
the files is refused by name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from engine.ckpt.int4_packed import check_packed, dequantise_stored, packed_scheme
from engine.ckpt.safetensors_io import WeightSet, open_weights
from engine.ckpt.target_layout import resolve_layout
from engine.errors import EngineError


class _Enough(Exception):
    """Raised by the last needed hook: the rest of the forward is not computed."""


def layer_bytes(target_dir: str, names: list[str], sizes: dict[str, int]) -> tuple[int, int]:
    """(bytes outside the decoder layers, bytes of the largest layer) this forward holds in
    float32 (the lm_head is never loaded), from `sizes` (stored name -> element count once
    dequantised: int4_packed.float_numel)."""
    layout = resolve_layout(target_dir, names)
    rest, per = 0, dict[int, int]()
    for n in names:
        text = layout.to_text(n)
        if text is None or text.startswith("lm_head."):
            continue
        m = re.match(r"model\.layers\.(\d+)\.", text)
        if m:
            per[int(m.group(1))] = per.get(int(m.group(1)), 0) + 4 * sizes[n]
        else:
            rest += 4 * sizes[n]
    return rest, max(per.values(), default=0)


class LayerwiseReference:
    """States at vLLM's layer ids (id k < N: input of decoder layer k; id N: the last layer's
    output) from a forward that holds one decoder layer at a time; `states(ids)` as
    reference_check.Reference's."""

    def __init__(self, target_dir: str, layer_ids: list[int]) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        from engine.data.target import text_stack_kwargs
        hf_logging.disable_progress_bar()
        self.path = target_dir
        self.layer_ids = list(layer_ids)
        kw = text_stack_kwargs(target_dir)
        cfg = kw.get("config") or AutoConfig.from_pretrained(target_dir)
        with torch.device("meta"):
            self.model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        self.model.eval().requires_grad_(False)
        self.base = self.model.base_model
        if not hasattr(self.base, "layers"):
            raise EngineError(f"{target_dir}: unsupported architecture "
                              f"{type(self.model).__name__} (no decoder .layers)")
        self.n = int(cfg.num_hidden_layers)
        self._mapping = _conversion_mapping(self.model, kw.get("key_mapping"))
        self._scheme = packed_scheme(target_dir)
        self.ws: WeightSet = open_weights(Path(target_dir))
        check_packed(self.ws.entries, self._scheme, str(Path(target_dir) / "config.json"))
        self._layout = resolve_layout(target_dir, list(self.ws.names()))
        self._load(lambda text: not text.startswith("model.layers.")
                   and not text.startswith("lm_head."), "the embedding")
        self._materialise_outside_layers()

    def _stored(self, keep: Any) -> dict[str, Tensor]:
        out = {}
        for n in self.ws.names():
            text = self._layout.to_text(n)
            if text is not None and keep(text):
                out[n] = self.ws.load(n)
        return dequantise_stored(out, self._scheme,
                                 {n: self.ws.entries[n].file for n in out})

    def _load(self, keep: Any, what: str) -> None:
        """The stored tensors whose causal-LM name `keep` accepts, through transformers' own
        loading step (module docstring)."""
        from transformers.core_model_loading import convert_and_load_state_dict_in_model
        from transformers.modeling_utils import LoadStateDictConfig
        sd = self._stored(keep)
        if not sd:
            raise EngineError(f"{self.path}: no tensors for {what} in the weight files")
        info, _ = convert_and_load_state_dict_in_model(
            self.model, sd, LoadStateDictConfig(dtype=torch.float32,
                                                weight_mapping=self._mapping))
        if info.conversion_errors:
            raise EngineError(f"{self.path}: cannot load {what} "
                              f"({next(iter(info.conversion_errors.items()))})")

    def _materialise_outside_layers(self) -> None:
        """Buffers computed at construction (the rotary embedding's inverse frequencies) are
        still meta: rebuild those modules on the CPU from the config."""
        for name, mod in list(self.base.named_children()):
            if name == "layers" or not any(b.is_meta for b in mod.buffers()):
                continue
            if any(True for _ in mod.parameters()):
                raise EngineError(f"{self.path}: {name} ({type(mod).__name__}) has buffers "
                                  "that are not in the weight files")
            try:
                setattr(self.base, name, type(mod)(config=self.base.config))
            except TypeError:
                raise EngineError(f"{self.path}: cannot rebuild {name} "
                                  f"({type(mod).__name__}) outside the meta device") from None
        meta = [n for n, t in [*self.base.named_parameters(), *self.base.named_buffers()]
                if t.is_meta and not n.startswith("layers.")]
        if meta:
            raise EngineError(f"{self.path}: {', '.join(meta[:4])} not in the weight files")

    def _load_layer(self, k: int) -> None:
        prefix = f"model.layers.{k}."
        self._load(lambda text: text.startswith(prefix), f"decoder layer {k}")
        layer = self.base.layers[k]
        meta = [n for n, t in [*layer.named_parameters(), *layer.named_buffers()] if t.is_meta]
        if meta:
            raise EngineError(
                f"{self.path}: decoder layer {k}: {', '.join(meta[:4])} not in the weight files "
                "(a quantised checkpoint? the layer-by-layer reference reads unquantised and "
                "pack-quantized int4 weights; use --reference-check off)")

    @torch.no_grad()
    def states(self, ids: list[int]) -> Tensor:
        """[T, L, H] for the token ids `ids` (one sample)."""
        got: dict[int, Tensor] = {}
        wanted = set(self.layer_ids)
        last = max(wanted)
        handles = []

        def before(k: int) -> Any:
            def hook(_mod: Any, args: tuple, kwargs: dict) -> None:
                if k in wanted:
                    got[k] = (args[0] if args else kwargs["hidden_states"])[0].clone()
                if k == last:
                    raise _Enough
                self._load_layer(k)
            return hook

        def after(_mod: nn.Module, _args: Any, _out: Any) -> None:
            _mod.to("meta")  # release the layer's weights

        for k in range(min(last, self.n) + 1):
            mod = self.base.layers[k] if k < self.n else self.base.norm
            handles.append(mod.register_forward_pre_hook(before(k), with_kwargs=True))
            if k < self.n:
                handles.append(mod.register_forward_hook(after))
        try:
            self.base(input_ids=torch.tensor([ids]), use_cache=False)
        except _Enough:
            pass
        finally:
            for h in handles:
                h.remove()
            for layer in self.base.layers[:min(last, self.n)]:
                layer.to("meta")
        return torch.stack([got[k] for k in self.layer_ids], dim=1)


def _conversion_mapping(model: Any, key_mapping: dict[str, str] | None) -> list[Any]:
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
    except ImportError:
        raise EngineError("the layer-by-layer reference check needs transformers >= 5 "
                          "(transformers.conversion_mapping)") from None
    return list(get_model_conversion_mapping(model, key_mapping=key_mapping or None))
