"""What a target directory holds: a causal LM, or a multimodal wrapper around one (Kimi-K2.5's
`KimiK25ForConditionalGeneration`, Llava, Qwen-VL, ...), and where its text stack's weights are.

Every reader of a target goes through `resolve_layout` (torch-free): the transformers load
(engine/data/target.py: the text stack alone, never the vision tower), the embedding and lm_head
(engine/ckpt/target_weights.py), the final norm (engine/ckpt/final_norm.py), and the config checks
(engine/ckpt/target_config.py's `read_config` unwraps `text_config`). Where the engine starts vLLM
for text only (the capture paths, `eval --vllm-engine`), `vllm_text_only` tells vLLM to build a
wrapper's text stack alone (`language_model_only`) unless the user said otherwise.

A wrapper stores its text stack in one of two ways (vLLM 0.32's `hf_to_vllm_mapper`s):
- `language_model.model.*` + `language_model.lm_head.*` (Kimi-K2.5, older Llava/Mistral3 exports);
- `model.language_model.*` + `lm_head.*` (transformers >= 4.52 exports: Llava, Qwen2.5/3-VL,
  Gemma3/4, Mistral3).
The wrapper's config carries the text stack's config under `text_config`; Kimi's says model_type
`kimi_k2`, which is DeepSeek-V3 (vLLM and transformers both read it as such).
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.errors import EngineError
from engine.fileio import read_json

# The multimodal wrappers vLLM 0.32 serves an EAGLE-3 drafter behind (the SupportsEagle3 models
# whose aux layers and lm_head are taken from `get_language_model()`); informational: detection
# is structural (a `text_config` and the text stack's key prefix), so a new wrapper works too.
VLLM_EAGLE3_WRAPPERS = (
    "KimiK25ForConditionalGeneration", "LlavaForConditionalGeneration",
    "Mistral3ForConditionalGeneration", "PixtralForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration", "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration", "Qwen3OmniMoeThinkerForConditionalGeneration",
    "Qwen3ASRForConditionalGeneration", "Gemma4ForConditionalGeneration",
    "Llama4ForConditionalGeneration", "MiniCPMV4_6ForConditionalGeneration",
    "CohereCompassForConditionalGeneration", "NemotronH_Nano_VL_V2", "MiMoV2OmniForCausalLM",
)

#: vLLM's engine argument that builds a multimodal model's language model alone (no vision
#: tower, no multimodal processor): `--language-model-only` on `vllm serve`
LANGUAGE_MODEL_ONLY = "language_model_only"

# text_config model types that transformers knows under another name
_TEXT_MODEL_TYPES = {"kimi_k2": "deepseek_v3"}

# (decoder prefix, lm_head prefix) as stored, per wrapper layout; the plain causal LM last
_LAYOUTS = (("language_model.model.", "language_model.lm_head."),
            ("model.language_model.", "lm_head."),
            ("model.", "lm_head."))


@dataclass(frozen=True)
class TargetLayout:
    """Where a target's text stack is. `wrapper` is the wrapper's architecture (None for a causal
    LM); `text_config` the text stack's config (model_type as transformers knows it);
    `decoder`/`head` the stored prefixes of the decoder (`embed_tokens`, `layers`, `norm`) and
    of the lm_head."""

    path: str
    wrapper: str | None
    text_config: dict[str, Any]
    decoder: str = "model."
    head: str = "lm_head."

    def to_text(self, stored: str) -> str | None:
        """A stored tensor name as the causal LM names it ('model.layers.0...', 'lm_head.weight');
        None for a tensor outside the text stack (a vision tower, a projector)."""
        if stored.startswith(self.head):
            return "lm_head." + stored[len(self.head):]
        if stored.startswith(self.decoder):
            return "model." + stored[len(self.decoder):]
        return None

    def text_names(self, names: list[str]) -> list[str]:
        """The stored names that belong to the text stack."""
        return [n for n in names if self.to_text(n) is not None]

    def key_mapping(self) -> dict[str, str]:
        """transformers' from_pretrained `key_mapping` (regex -> replacement) from stored names
        to the causal LM's."""
        if self.wrapper is None:
            return {}
        return {"^" + re.escape(self.head): "lm_head.", "^" + re.escape(self.decoder): "model."}


def stored_names(target_dir: str) -> list[str]:
    """The tensor names in a target's safetensors files, from the index or the file headers
    (no tensor is read)."""
    index = os.path.join(target_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        wm = read_json(index).get("weight_map")
        if isinstance(wm, dict):
            return sorted(wm)
    names: list[str] = []
    for f in sorted(os.listdir(target_dir)) if os.path.isdir(target_dir) else []:
        if f.endswith(".safetensors"):
            with open(os.path.join(target_dir, f), "rb") as fh:
                try:
                    (n,) = struct.unpack("<Q", fh.read(8))
                    header = json.loads(fh.read(n))
                except (struct.error, ValueError):
                    raise EngineError(f"{os.path.join(target_dir, f)}: not a safetensors file "
                                      "(bad header)") from None
            names += [k for k in header if k != "__metadata__"]
    return sorted(names)


def resolve_layout(target_dir: str, names: list[str] | None = None) -> TargetLayout:
    """The target's layout: a config with a `text_config` is a wrapper; its decoder prefix is the
    first of the known layouts its stored names use (`names`, else read from the files)."""
    cfg = read_json(os.path.join(target_dir, "config.json"),
                    missing="no such file (is --target a model directory?)")
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        return TargetLayout(path=target_dir, wrapper=None, text_config=dict(cfg))
    text = dict(text)
    mt = str(text.get("model_type") or "")
    text["model_type"] = _TEXT_MODEL_TYPES.get(mt, mt)
    for key in ("torch_dtype", "dtype"):  # the wrapper's dtype when the text stack names none
        if key in cfg and "torch_dtype" not in text and "dtype" not in text:
            text[key] = cfg[key]
    archs = cfg.get("architectures")
    wrapper = str(archs[0]) if isinstance(archs, list) and archs else str(cfg.get("model_type"))
    have = names if names is not None else stored_names(target_dir)
    for dec, head in _LAYOUTS:
        if any(n.startswith(dec + "layers.") or n.startswith(dec + "embed_tokens.")
               for n in have):
            return TargetLayout(path=target_dir, wrapper=wrapper, text_config=text,
                                decoder=dec, head=head)
    raise EngineError(f"{target_dir}: {wrapper} has a text_config but no text stack among its "
                      "weights (looked for 'language_model.model.layers.*', "
                      "'model.language_model.layers.*', 'model.layers.*')")


def vllm_text_only(target_dir: str, given: Iterable[str]) -> tuple[dict[str, Any], str]:
    """({"language_model_only": True}, the log line saying so) for a multimodal wrapper when
    the user's own engine arguments (`given`: their names, dashes or underscores, `--` allowed)
    do not name it; ({}, "") for a causal LM, a directory without a config.json, or when they
    do. The engine's vLLM uses are text only (capture, acceptance), and a wrapper's vision
    tower would cost memory and start-up time (Kimi-K2.5's MoonViT) for nothing."""
    names = {g.lstrip("-").split("=")[0].replace("-", "_").removeprefix("no_") for g in given}
    if LANGUAGE_MODEL_ONLY in names or not os.path.isfile(os.path.join(target_dir,
                                                                        "config.json")):
        return {}, ""
    wrapper = resolve_layout(target_dir).wrapper
    if wrapper is None:
        return {}, ""
    return {LANGUAGE_MODEL_ONLY: True}, (
        f"{target_dir} is {wrapper}, a multimodal wrapper: vLLM builds its text stack alone "
        f"({LANGUAGE_MODEL_ONLY}=true; the vision tower is not built); pass "
        f"{LANGUAGE_MODEL_ONLY}=false yourself to build it")
