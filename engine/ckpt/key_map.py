"""The key-map adapter: how each checkpoint style names its tensors, and where a target model
keeps its embedding and lm_head (docs/eagle3.md#checkpoint-key-names).

Drafter styles (EAGLE and speculators key names)
    eagle        `midlayer.*` names, flat Llama config (EAGLE, SpecForge, AQ-MedAI; what vLLM and
                 SGLang both load; `vllm` and `sglang` exports are this style plus engine checks)
    speculators  `layers.0.*` names, config with `speculators_model_type` and
                 `transformer_layer_config`
The canonical names are the EAGLE ones (engine/model/draft.py). The only key difference between
styles is the layer prefix, so the map is one table, LAYER_PREFIX, with torchtitan-style directions:
    from_speculators(sd) / to_speculators(sd) / from_eagle(sd) / to_eagle(sd)
work on any name -> value mapping (tensors, file entries, shapes). detect() tells the style.
MLA drafters (engine/model/mla_layer.py) use the same map: TorchSpec writes `midlayer.*` and
vLLM's Eagle3DeepseekV2ForCausalLM loader renames `midlayer.` to `layers.0.` (then fuses
q_a_proj and kv_a_proj_with_mqa itself), so either prefix is read and `midlayer.*` is written.

Targets: target_heads(names, tied) is the one rule for a target's input embedding and lm_head
tensor names (engine/ckpt/target_weights.py reads them; a tied target's lm_head is its embedding).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from engine.ckpt.config_styles import config_style
from engine.errors import EngineError

STYLES = ("eagle", "speculators")
EXPORT_TARGETS = ("eagle", "speculators", "vllm", "sglang")
# The whole key map: the decoder layer's prefix per style. Everything else has the same name.
LAYER_PREFIX = {"eagle": "midlayer.", "speculators": "layers.0."}
CANONICAL = "eagle"
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some trainers save; no engine loads them
T = TypeVar("T")


def to_canonical(name: str, style: str) -> str:
    src = LAYER_PREFIX[style]
    return LAYER_PREFIX[CANONICAL] + name[len(src):] if name.startswith(src) else name


def from_canonical(name: str, style: str) -> str:
    src = LAYER_PREFIX[CANONICAL]
    return LAYER_PREFIX[style] + name[len(src):] if name.startswith(src) else name


def from_speculators(sd: Mapping[str, T]) -> dict[str, T]:
    return {to_canonical(k, "speculators"): v for k, v in sd.items()}


def to_speculators(sd: Mapping[str, T]) -> dict[str, T]:
    return {from_canonical(k, "speculators"): v for k, v in sd.items()}


def from_eagle(sd: Mapping[str, T]) -> dict[str, T]:
    return {to_canonical(k, "eagle"): v for k, v in sd.items()}


def to_eagle(sd: Mapping[str, T]) -> dict[str, T]:
    return {from_canonical(k, "eagle"): v for k, v in sd.items()}


def output_style(to: str) -> str:
    """The naming/config style an export target writes (vllm and sglang write eagle style)."""
    return "speculators" if to == "speculators" else "eagle"


@dataclass(frozen=True)
class Detected:
    """How a checkpoint names its tensors and writes its config."""

    format: str  # "eagle" | "speculators" | "mixed"
    key_style: str
    config_style: str


def detect(names: list[str], config: dict[str, Any], where: str) -> Detected:
    """The style from the tensor names and the config; raises for neither or both."""
    has = {s: any(n.startswith(p) for n in names) for s, p in LAYER_PREFIX.items()}
    if has["eagle"] and has["speculators"]:
        raise EngineError(f"{where}: both midlayer.* and layers.0.* tensors: unknown style")
    if not any(has.values()):
        sample = ", ".join(sorted(names)[:3]) or "no tensors"
        raise EngineError(f"{where}: unknown style: no midlayer.* or layers.0.* tensors "
                          f"(found {sample})")
    keys = "eagle" if has["eagle"] else "speculators"
    cstyle = config_style(config)
    return Detected(keys if keys == cstyle else "mixed", keys, cstyle)


# -- where a TARGET keeps its embedding and lm_head ------------------------------------------------

# Known names first, in this order (HF Llama-likes, then multimodal wrappers' text stacks).
TARGET_EMBED_NAMES = ("model.embed_tokens.weight", "embed_tokens.weight",
                      "model.language_model.embed_tokens.weight",
                      "language_model.model.embed_tokens.weight")
TARGET_HEAD_NAMES = ("lm_head.weight", "model.lm_head.weight", "language_model.lm_head.weight")


def _by_suffix(names: list[str], suffix: str) -> str | None:
    """An unlisted wrapper's name: outside decoder and MTP layers, a language model's first,
    then the shortest."""
    cands = [n for n in names if (n == suffix or n.endswith("." + suffix))
             and ".layers." not in n and not n.startswith(("mtp.", "model.mtp."))]
    if not cands:
        return None
    return sorted(cands, key=lambda n: ("language_model" not in n, len(n), n))[0]


def target_heads(names: Iterable[str], tied: bool | None, where: str, need_head: bool = True
                 ) -> tuple[str, str]:
    """(embedding name, lm_head name) among a target's stored tensor names. A target without an
    lm_head tensor uses its embedding when it ties them: `tied` is config.json's
    tie_word_embeddings, None when the target has no config.json to say (then the embedding is
    used too). Raises naming `where` when the embedding is missing, or (with `need_head`) the
    lm_head of an untied target."""
    names = list(names)
    have = set(names)
    emb = next((n for n in TARGET_EMBED_NAMES if n in have), None) or _by_suffix(
        names, "embed_tokens.weight")
    head = next((n for n in TARGET_HEAD_NAMES if n in have), None) or _by_suffix(
        names, "lm_head.weight")
    if emb is None:
        raise EngineError(f"{where}: no embedding tensor (looked for "
                          f"{', '.join(TARGET_EMBED_NAMES)} and '*.embed_tokens.weight')")
    if head is None:
        if tied is False and need_head:
            raise EngineError(f"{where}: no 'lm_head.weight' tensor and tie_word_embeddings "
                              "is false")
        head = emb
    return emb, head
