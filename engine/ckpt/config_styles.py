"""The drafter config's two on-disk styles: a config.json dict read into `Eagle3Config`
(engine/model/config.py) and written back out (docs/eagle3.md#config-fields-eagle-style,
docs/eagle3.md#config-fields-speculators-style, docs/eagle3.md#eagle-31-flags).

    config_style(d) -> "eagle" | "speculators"
    config_from_dict(d, norm_output_meaning=None) -> Eagle3Config
    to_eagle_dict(cfg), to_speculators_dict(cfg, verifier=, speculative_tokens=) -> dict

- EAGLE style: a flat Llama config with `architectures: ["LlamaForCausalLMEagle3"]`,
  `vocab_size` = TARGET vocab, `draft_vocab_size`, `tie_word_embeddings: false`,
  `target_hidden_size` only when it differs from `hidden_size`, aux ids (vLLM convention) only when
  they are not the defaults; `norm_output` only in the speculators/vLLM meaning and only when true
  (SpecForge reads the same key as "apply the final norm before lm_head at all", so a reader needs
  to know the writer).
- speculators style: `speculators_model_type: "eagle3"` with a full Llama dict under
  `transformer_layer_config`, `norm_before_residual` written explicitly, `speculators_config`.

An MLA drafter's config is the flat EAGLE style with vLLM's `architectures:
["Eagle3DeepseekV2ForCausalLM"]`, `model_type: "deepseek_v2"` (vLLM 0.32 serves a "deepseek_v3"
draft as its MTP model) and the MLA sizes; the speculators style cannot express it (vLLM's
speculators adapter builds llama/qwen3 layers only), so writing it there is refused.

The reader takes either style (and transformers 5's `rope_parameters` / `dtype` spellings);
problems raise EngineError naming the field, callers prefix the file name. A flat config carrying
`norm_output` is read in the meaning of who wrote it (`norm_output_meaning`, NORM_OUTPUT_MEANINGS);
unknown writer: refused, naming NORM_OUTPUT_ENV.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from engine.errors import EngineError
from engine.fileio import nonfinite_field
from engine.model.config import (
    MLA_FIELDS,
    Eagle3Config,
    aux_ids_problem,
    positive_int,
    serving_default_aux_ids,
)

EAGLE_ARCH = "LlamaForCausalLMEagle3"
MLA_ARCH = "Eagle3DeepseekV2ForCausalLM"  # vLLM 0.32 deepseek_eagle3 (V3 is an alias there)
# Names an MLA drafter's config is seen under: vLLM's two, TorchSpec's own.
MLA_ARCHS = (MLA_ARCH, "Eagle3DeepseekV3ForCausalLM", "DeepSeekForCausalLMEagle3")
SPECULATORS_ARCH = "Eagle3Speculator"
SPECULATORS_VERSION = "0.3.0"
# `norm_output` has two meanings: speculators/vLLM "hand the post-final-norm state to the
# next step" and SpecForge "apply the final norm before lm_head at all". The environment variable
# states which one a flat config means when nothing else tells.
NORM_OUTPUT_MEANINGS = ("speculators", "specforge")
NORM_OUTPUT_ENV = "EAGLE3_NORM_OUTPUT_MEANING"
NORM_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")  # spelled as vLLM reads them

# Llama config keys we do not interpret but carry through both styles unchanged (`cfg.extra`).
PASSTHROUGH_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "initializer_range",
                    "pretraining_tp", "use_cache", "attention_dropout")


def config_style(d: dict[str, Any]) -> str:
    """'speculators' when the dict carries speculators fields, else 'eagle'."""
    if "speculators_model_type" in d or "speculators_config" in d or \
            "transformer_layer_config" in d:
        return "speculators"
    return "eagle"


# -- reading ------------------------------------------------------------------------------------
def config_from_dict(d: dict[str, Any], norm_output_meaning: str | None = None
                     ) -> Eagle3Config:
    """Read an EAGLE-style (flat Llama) or speculators-style config dict. A flat config's
    `norm_output` is read as `norm_output_meaning` says (who wrote it; None: unknown)."""
    if not isinstance(d, dict):
        raise EngineError("config is not a JSON object")
    if (bad := nonfinite_field(d)) is not None:  # Python's json reads NaN and Infinity
        raise EngineError(f"config field {bad!r}: not a finite number (NaN or Infinity)")
    if config_style(d) != "speculators":
        return _from_llama(d, top=d, norm_output_meaning=norm_output_meaning)
    layer = d.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise EngineError("config field 'transformer_layer_config': missing or not an object")
    cfg = _from_llama(layer, top=d, norm_output_meaning="speculators")
    spec = d.get("speculators_config") or {}
    if not isinstance(spec, dict):
        raise EngineError("config field 'speculators_config': not an object")
    verifier = spec.get("verifier") or {}
    archs = verifier.get("architectures") if isinstance(verifier, dict) else None
    k = cfg.speculative_tokens
    methods = spec.get("proposal_methods") or []
    if not isinstance(methods, list):
        raise EngineError(f"config field 'speculators_config.proposal_methods': {methods!r} is "
                          "not a list")
    for p in methods:
        if isinstance(p, dict) and isinstance(p.get("speculative_tokens"), int):
            k = p["speculative_tokens"]
            break
    # vLLM assumes true when the field is absent; follow the engine that will serve it.
    nbr = d.get("norm_before_residual", True)
    if not isinstance(nbr, bool):
        raise EngineError(f"config field 'norm_before_residual': {nbr!r} is not a bool")
    return replace(  # validated again
        cfg, verifier=verifier.get("name_or_path") if isinstance(verifier, dict) else None,
        verifier_architectures=list(archs) if isinstance(archs, list) else None,
        speculative_tokens=k, norm_before_residual=nbr)


def _from_llama(layer: dict[str, Any], top: dict[str, Any],
                norm_output_meaning: str | None) -> Eagle3Config:
    """Build from a flat Llama dict (`layer`); draft-level fields come from `top`."""
    def req(key: str) -> Any:
        if key not in layer or layer[key] is None:
            raise EngineError(f"config field {key!r}: missing")
        return layer[key]

    act = layer.get("hidden_act", "silu")
    if act != "silu":
        raise EngineError(f"config field 'hidden_act': {act!r} (only 'silu' is EAGLE-3)")
    for key in ("attention_bias", "mlp_bias"):
        if layer.get(key):
            raise EngineError(f"config field {key!r}: true is not supported (EAGLE-3 has no bias)")
    nl = layer.get("num_hidden_layers", 1)
    if nl != 1:
        raise EngineError(f"config field 'num_hidden_layers': {nl!r} (an EAGLE-3 drafter has 1)")
    if top.get("tie_word_embeddings") or layer.get("tie_word_embeddings"):
        raise EngineError("config field 'tie_word_embeddings': true would tie lm_head to the "
                          "embedding in SGLang")
    rope_theta = layer.get("rope_theta")
    rope_scaling = layer.get("rope_scaling")
    params = layer.get("rope_parameters")  # transformers 5 spelling
    if isinstance(params, dict):
        rope_theta = params.get("rope_theta", rope_theta)
        if params.get("rope_type", "default") != "default":
            rope_scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    archs = top.get("architectures") or layer.get("architectures") or []
    mla = layer.get("kv_lora_rank") is not None
    if isinstance(archs, list) and any(a in MLA_ARCHS for a in archs) and not mla:
        raise EngineError(f"config field 'kv_lora_rank': missing ({archs[0]} is an MLA drafter)")
    if mla and layer.get("rope_interleave", True) is not True:
        raise EngineError("config field 'rope_interleave': false (vLLM runs an MLA drafter's "
                          "RoPE interleaved, GPT-J style; this drafter would serve as another "
                          "function)")
    aux = top.get("eagle_aux_hidden_state_layer_ids")  # vLLM convention
    eagle_cfg = top.get("eagle_config")
    if aux is None and isinstance(eagle_cfg, dict):
        sgl = eagle_cfg.get("eagle_aux_hidden_state_layer_ids")  # SGLang/SpecForge: outputs
        if isinstance(sgl, list) and all(isinstance(k, int) for k in sgl):
            aux = [k + 1 for k in sgl]
        elif sgl is not None:
            raise EngineError("config field 'eagle_config.eagle_aux_hidden_state_layer_ids': "
                              f"{sgl!r} is not a list of layer ids")
    kwargs: dict[str, Any] = {
        "hidden_size": req("hidden_size"),
        "intermediate_size": req("intermediate_size"),
        "num_attention_heads": req("num_attention_heads"),
        "vocab_size": req("vocab_size"),
        "draft_vocab_size": top.get("draft_vocab_size", layer.get("draft_vocab_size")),
        "num_key_value_heads": layer.get("num_key_value_heads"),
        "head_dim": layer.get("head_dim"),
        "target_hidden_size": top.get("target_hidden_size", layer.get("target_hidden_size")),
        "rms_norm_eps": layer.get("rms_norm_eps", 1e-5),
        "rope_theta": 10000.0 if rope_theta is None else rope_theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": layer.get("max_position_embeddings", 2048),
        "aux_layer_ids": list(aux) if isinstance(aux, (list, tuple)) else aux,
        "target_num_layers": top.get("target_num_hidden_layers"),
        "torch_dtype": str(top.get("torch_dtype") or layer.get("torch_dtype")
                           or layer.get("dtype") or "bfloat16").replace("torch.", ""),
        "extra": {k: copy.deepcopy(layer[k]) for k in PASSTHROUGH_KEYS if k in layer},
        **{k: layer.get(k) for k in MLA_FIELDS},
    }
    if mla:  # vLLM's deepseek_eagle3 honours it from the flat config (default false)
        nbr = top.get("norm_before_residual", False)
        if not isinstance(nbr, bool):
            raise EngineError(f"config field 'norm_before_residual': {nbr!r} is not a bool")
        kwargs["norm_before_residual"] = nbr
    for flag in ("norm_before_fc", "fc_norm"):
        v = top.get(flag, eagle_cfg.get(flag, False) if isinstance(eagle_cfg, dict) else False)
        if not isinstance(v, bool):
            raise EngineError(f"config field {flag!r}: {v!r} is not a bool")
        kwargs[flag] = v
    kwargs["norm_output"] = _read_norm_output(top, norm_output_meaning)
    try:
        return Eagle3Config(**kwargs)
    except TypeError as e:  # a field with a wrong JSON type reached a comparison
        raise EngineError(f"config: {e}") from e


def _read_norm_output(top: dict[str, Any], meaning: str | None) -> bool:
    """The top-level `norm_output` in our (speculators/vLLM) meaning. vLLM reads it from the top
    level only, default false. SpecForge's true is plain EAGLE math (final norm before lm_head);
    its false (no final norm) is a model this engine does not have."""
    v = top.get("norm_output")
    if v is None:
        return False
    if not isinstance(v, bool):
        raise EngineError(f"config field 'norm_output': {v!r} is not a bool")
    if meaning == "speculators":
        return v
    if meaning == "specforge":
        if not v:
            raise EngineError("config field 'norm_output': false in SpecForge's meaning (no "
                              "final norm before lm_head) is not supported")
        return False
    if meaning is not None:
        raise EngineError(f"{NORM_OUTPUT_ENV}={meaning!r}: not one of "
                          f"{', '.join(NORM_OUTPUT_MEANINGS)}")
    raise EngineError(f"config field 'norm_output': {v!r} means different things to "
                      "speculators/vLLM and SpecForge and nothing says who wrote this config; set "
                      f"{NORM_OUTPUT_ENV}=speculators or =specforge")


# -- writing ------------------------------------------------------------------------------------
def to_eagle_dict(cfg: Eagle3Config) -> dict[str, Any]:
    """The EAGLE-style config.json that vLLM and SGLang both load."""
    if cfg.norm_before_residual and cfg.layer_kind != "mla":
        raise EngineError("config field 'norm_before_residual' is true: EAGLE-style engines "
                          "(vLLM/SGLang llama_eagle3) cannot express it; keep speculators "
                          "style")
    if cfg.layer_kind == "mla":
        out = {"architectures": [MLA_ARCH], **_mla_dict(cfg),
               "draft_vocab_size": cfg.draft_vocab_size}
    else:
        out = {"architectures": [EAGLE_ARCH], **_llama_dict(cfg),
               "draft_vocab_size": cfg.draft_vocab_size}
    if cfg.target_hidden_size != cfg.hidden_size:
        out["target_hidden_size"] = cfg.target_hidden_size
    if cfg.aux_layer_ids is not None and not _aux_are_defaults(cfg):
        # vLLM reads the top-level field (id k = input of layer k); SGLang and SpecForge read
        # eagle_config's (id k = output of layer k), so that copy is shifted down by one.
        out["eagle_aux_hidden_state_layer_ids"] = list(cfg.aux_layer_ids)
        if min(cfg.aux_layer_ids) >= 1:
            out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids":
                                   [k - 1 for k in cfg.aux_layer_ids]}
    # Written only when used, at the top level where vLLM's llama/deepseek_eagle3 and its
    # speculators adapter read all three; older engines never see them.
    out.update({k: True for k in NORM_FLAGS if getattr(cfg, k)})
    if cfg.target_num_layers is not None:
        out["target_num_hidden_layers"] = cfg.target_num_layers
    return out


def to_speculators_dict(cfg: Eagle3Config, verifier: str | None = None,
                        speculative_tokens: int | None = None,
                        verifier_architectures: list[str] | None = None) -> dict[str, Any]:
    """The speculators-style config.json; `norm_before_residual` always written explicitly."""
    if cfg.layer_kind == "mla":
        raise EngineError("speculators: an MLA drafter (kv_lora_rank) cannot be expressed "
                          "in the speculators style (vLLM's speculators adapter builds "
                          "llama/qwen3 layers only); export --to vllm or eagle")
    name = verifier if verifier is not None else cfg.verifier
    k = speculative_tokens if speculative_tokens is not None else cfg.speculative_tokens
    positive_int("speculative_tokens", k)
    archs = verifier_architectures or cfg.verifier_architectures or []
    layer = {"architectures": ["LlamaForCausalLM"], **_llama_dict(cfg)}
    aux = None if cfg.aux_layer_ids is None or _aux_are_defaults(cfg) else list(
        cfg.aux_layer_ids)
    out: dict[str, Any] = {
        "speculators_model_type": "eagle3",
        "architectures": [SPECULATORS_ARCH],
        "transformer_layer_config": layer,
        "draft_vocab_size": cfg.draft_vocab_size,
        "norm_before_residual": cfg.norm_before_residual,
        "target_hidden_size": (None if cfg.target_hidden_size == cfg.hidden_size
                               else cfg.target_hidden_size),
        "eagle_aux_hidden_state_layer_ids": aux,
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k,
                                  "verifier_accept_k": 1}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": name, "architectures": list(archs)},
        },
        "torch_dtype": cfg.torch_dtype,
    }
    # speculators 0.9 writes all three at the top level, false included (vLLM's adapter
    # reads them there, default false).
    out.update({f: bool(getattr(cfg, f)) for f in NORM_FLAGS})
    if cfg.target_num_layers is not None:
        out["target_num_hidden_layers"] = cfg.target_num_layers
    return out


def _llama_dict(cfg: Eagle3Config) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": copy.deepcopy(cfg.rope_scaling),
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": cfg.torch_dtype,
    }
    out.update(copy.deepcopy(cfg.extra))
    return out


def _mla_dict(cfg: Eagle3Config) -> dict[str, Any]:
    """The flat DeepSeek layer config vLLM's Eagle3DeepseekV2ForCausalLM reads (through
    transformers' DeepseekV2Config: head_dim is derived there, so not written)."""
    out = _llama_dict(cfg)
    del out["head_dim"], out["mlp_bias"]
    # deepseek_v2, not _v3: vLLM 0.32 turns a deepseek_v3 draft config into its MTP model
    # (SpeculativeConfig.hf_config_override) whatever `architectures` says
    out["model_type"] = "deepseek_v2"
    out.update({k: getattr(cfg, k) for k in MLA_FIELDS})
    out["rope_interleave"] = True  # vLLM's MLA RoPE is GPT-J style (is_neox_style=False)
    rs = out["rope_scaling"]
    if rs is not None and "original_max_position_embeddings" not in rs:
        # what our yarn used; vLLM's deepseek_yarn requires the key
        rs["original_max_position_embeddings"] = cfg.max_position_embeddings
    if cfg.norm_before_residual:  # deepseek_eagle3 reads it from the flat config
        out["norm_before_residual"] = True
    return out


def _aux_are_defaults(cfg: Eagle3Config) -> bool:
    """Whether the ids are what a serving engine computes when the config omits them (so they
    may be omitted): 2, N//2, N-3, and distinct."""
    return (cfg.target_num_layers is not None and cfg.aux_layer_ids is not None
            and cfg.aux_layer_ids == serving_default_aux_ids(cfg.target_num_layers)
            and aux_ids_problem(cfg.aux_layer_ids) is None)
