"""The drafter's typed config (`Eagle3Config`) and its two on-disk config styles (named presets:
engine/model/presets.py).

Re-exported by engine/model/draft.py; kept apart so the model file reads as the math only.

Config styles (the two config.json layouts drafters ship in):
- EAGLE style: a flat Llama config with `architectures: ["LlamaForCausalLMEagle3"]`,
  `vocab_size` = TARGET vocab, `draft_vocab_size`, `tie_word_embeddings: false`,
  `target_hidden_size` only when it differs from `hidden_size`, aux ids (vLLM convention) only when
  they are not the defaults; `norm_output` only in the speculators/vLLM meaning and only when true
  (section 4a: SpecForge reads the same key differently, so a reader needs to know the writer).
- speculators style: `speculators_model_type: "eagle3"` with a full Llama dict under
  `transformer_layer_config`, `norm_before_residual` written explicitly, `speculators_config`.

Layer kinds (`Eagle3Config.layer_kind`): "llama" (the EAGLE-3 layer) or "mla" (DeepSeek-V2/V3
multi-head latent attention), told by `kv_lora_rank`. An MLA drafter's config is the flat
EAGLE style with vLLM's `architectures: ["Eagle3DeepseekV2ForCausalLM"]`, `model_type:
"deepseek_v2"` (vLLM 0.32 serves a "deepseek_v3" draft as its MTP model) and the MLA sizes; the
speculators style cannot express it (vLLM's speculators adapter builds llama/qwen3 layers only),
so writing it there is refused.

`Eagle3Config.from_dict` reads either (and transformers 5's `rope_parameters` / `dtype` spellings);
problems raise EngineError naming the field, callers prefix the file name. A flat config carrying
`norm_output` is read in the meaning of who wrote it (`norm_output_meaning`, NORM_OUTPUT_MEANINGS);
unknown writer: refused, naming NORM_OUTPUT_ENV.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from engine.errors import EngineError
from engine.fileio import nonfinite_field

EAGLE_ARCH = "LlamaForCausalLMEagle3"
MLA_ARCH = "Eagle3DeepseekV2ForCausalLM"  # vLLM 0.32 deepseek_eagle3 (V3 is an alias there)
# Names an MLA drafter's config is seen under: vLLM's two, TorchSpec's own.
MLA_ARCHS = (MLA_ARCH, "Eagle3DeepseekV3ForCausalLM", "DeepSeekForCausalLMEagle3")
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
              "v_head_dim")
SPECULATORS_ARCH = "Eagle3Speculator"
SPECULATORS_VERSION = "0.3.0"
ROPE_TYPES = ("default", "linear", "llama3", "yarn")
DTYPES = ("float32", "float16", "bfloat16")
# `norm_output` has two meanings: speculators/vLLM "hand the post-final-norm state to the
# next step" and SpecForge "apply the final norm before lm_head at all". The environment variable
# states which one a flat config means when nothing else tells.
NORM_OUTPUT_MEANINGS = ("speculators", "specforge")
NORM_OUTPUT_ENV = "EAGLE3_NORM_OUTPUT_MEANING"
NORM_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")  # spelled as vLLM reads them

# Llama config keys we do not interpret but carry through both styles unchanged.
PASSTHROUGH_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "initializer_range",
                    "pretraining_tp", "use_cache", "attention_dropout")


@dataclass
class Eagle3Config:
    """Everything that fixes the drafter's shapes and math. H hidden size, Ht target hidden,
    V target vocab, Vd draft vocab."""

    hidden_size: int
    """H: the draft model's hidden width."""
    intermediate_size: int
    """I: MLP width (gate/up [I, H], down [H, I])."""
    num_attention_heads: int
    """nh: query heads."""
    vocab_size: int
    """V: the TARGET vocab (embedding rows, t2d length)."""
    draft_vocab_size: int | None = None
    """Vd: lm_head rows and d2t length; None means V (no vocab map)."""
    num_key_value_heads: int | None = None
    """nkv: key/value heads for grouped-query attention; None means nh."""
    head_dim: int | None = None
    """hd: per-head width; None means H // nh."""
    target_hidden_size: int | None = None
    """Ht: the target's hidden width (fc is [H, 3*Ht]); None means H."""
    q_lora_rank: int | None = None
    """MLA: rank of the query down-projection (q_a_proj); None: one q_proj (DeepSeek-V2-Lite)."""
    kv_lora_rank: int | None = None
    """MLA: rank of the compressed key/value latent; set = an MLA layer (`layer_kind`)."""
    qk_nope_head_dim: int | None = None
    """MLA: per-head query/key width without RoPE."""
    qk_rope_head_dim: int | None = None
    """MLA: per-head query/key width with RoPE (the key's part is shared by all heads); an MLA
    config's head_dim is this (as transformers' DeepseekV3Config sets it)."""
    v_head_dim: int | None = None
    """MLA: per-head value width."""
    rms_norm_eps: float = 1e-5
    """epsilon of every RMSNorm."""
    rope_theta: float = 10000.0
    """RoPE base."""
    rope_scaling: dict[str, Any] | None = None
    """None (default RoPE) or a dict with `rope_type` in ROPE_TYPES and that type's fields."""
    max_position_embeddings: int = 2048
    """longest position the rope tables are sized for (yarn also reads it)."""
    aux_layer_ids: list[int] | None = None
    """three target layer ids (vLLM convention: id k = INPUT of layer k); None = 2, N//2, N-3."""
    target_num_layers: int | None = None
    """N: decoder layers of the target, when known (resolves the default aux ids)."""
    torch_dtype: str = "bfloat16"
    """dtype the weights are stored in."""
    norm_before_residual: bool = False
    """False is EAGLE math (residual = un-normalised h). True is a speculators variant."""
    norm_before_fc: bool = False
    """speculators `norm_before_fc`: an RMSNorm `input_norm` [3Ht] applied before fc."""
    fc_norm: bool = False
    """per-chunk RMSNorms `fc_norm.{0,1,2}` [Ht] before fc (seen in some public drafters)."""
    norm_output: bool = False
    """speculators/vLLM `norm_output` (EAGLE 3.1): the state handed to the next draft step is the
    one after the final norm (logits = lm_head of it); False: the pre-norm state is handed on."""
    verifier: str | None = None
    """speculators_config.verifier.name_or_path (the target this drafter serves)."""
    verifier_architectures: list[str] | None = None
    """speculators_config.verifier.architectures."""
    speculative_tokens: int = 3
    """k of the greedy proposal written to speculators_config."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Llama keys we carry through untouched (PASSTHROUGH_KEYS)."""

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"):
            _positive_int(name, getattr(self, name))
        if self.draft_vocab_size is None:
            self.draft_vocab_size = self.vocab_size
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.kv_lora_rank is not None:
            self._check_mla()
        elif (stray := next((f for f in MLA_FIELDS if getattr(self, f) is not None), None)):
            raise EngineError(f"config field {stray!r}: set without kv_lora_rank (an MLA "
                              "drafter needs both)")
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise EngineError(f"config field 'head_dim': missing and hidden_size "
                                  f"{self.hidden_size} is not divisible by num_attention_heads "
                                  f"{self.num_attention_heads}")
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.target_hidden_size is None:
            self.target_hidden_size = self.hidden_size
        for name in ("draft_vocab_size", "num_key_value_heads", "head_dim", "target_hidden_size",
                     "max_position_embeddings", "speculative_tokens"):
            _positive_int(name, getattr(self, name))
        if self.draft_vocab_size > self.vocab_size:
            raise EngineError(f"config field 'draft_vocab_size': {self.draft_vocab_size} exceeds "
                              f"vocab_size {self.vocab_size}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise EngineError(f"config field 'num_key_value_heads': {self.num_key_value_heads} "
                              f"does not divide num_attention_heads {self.num_attention_heads}")
        if self.head_dim % 2:
            raise EngineError(f"config field 'head_dim': {self.head_dim} must be even for RoPE")
        if not (isinstance(self.rms_norm_eps, (int, float)) and self.rms_norm_eps > 0):
            raise EngineError(f"config field 'rms_norm_eps': {self.rms_norm_eps!r} must be > 0")
        if not (isinstance(self.rope_theta, (int, float)) and self.rope_theta > 0):
            raise EngineError(f"config field 'rope_theta': {self.rope_theta!r} must be > 0")
        self.rope_scaling = _check_rope(self.rope_scaling)
        if self.aux_layer_ids is not None:
            ids = self.aux_layer_ids
            if (not isinstance(ids, list) or len(ids) != 3
                    or not all(isinstance(i, int) and i >= 0 for i in ids)):
                raise EngineError(f"config field 'eagle_aux_hidden_state_layer_ids': {ids!r} must "
                                  "be a list of 3 non-negative layer ids")
        if self.target_num_layers is not None:
            _positive_int("target_num_layers", self.target_num_layers)
        if self.torch_dtype not in DTYPES:
            raise EngineError(f"config field 'torch_dtype': {self.torch_dtype!r} is not one of "
                              f"{', '.join(DTYPES)}")

    def _check_mla(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(self, name) is None:
                raise EngineError(f"config field {name!r}: missing (an MLA drafter: "
                                  "kv_lora_rank is set)")
            _positive_int(name, getattr(self, name))
        if self.q_lora_rank is not None:
            _positive_int("q_lora_rank", self.q_lora_rank)
        if self.head_dim is None:
            self.head_dim = self.qk_rope_head_dim
        if self.head_dim != self.qk_rope_head_dim:
            raise EngineError(f"config field 'head_dim': {self.head_dim} != qk_rope_head_dim "
                              f"{self.qk_rope_head_dim} (an MLA drafter's RoPE width)")
        if self.num_key_value_heads not in (None, self.num_attention_heads):
            raise EngineError(f"config field 'num_key_value_heads': {self.num_key_value_heads} "
                              "!= num_attention_heads (MLA has one key/value per head)")
        kind = (self.rope_scaling or {}).get("rope_type", (self.rope_scaling or {}).get("type"))
        if kind not in (None, "default", "yarn"):
            raise EngineError(f"config field 'rope_scaling.rope_type': {kind!r} (an MLA drafter "
                              "takes default or yarn RoPE, as vLLM's DeepSeek layer does)")

    # -- derived -------------------------------------------------------------------------------
    @property
    def layer_kind(self) -> str:
        """"mla" (engine/model/mla_layer.py) when kv_lora_rank is set, else "llama"."""
        return "mla" if self.kv_lora_rank is not None else "llama"

    @property
    def has_vocab_map(self) -> bool:
        """True when the draft vocab is a subset of the target's (d2t/t2d are needed)."""
        return self.draft_vocab_size != self.vocab_size

    def resolved_aux_layer_ids(self, target_num_layers: int | None = None) -> list[int]:
        """The aux ids in vLLM convention; a config without them means what the serving engines
        compute, 2, N//2, N-3 from N (repeats included: inspect's `aux_layer_ids` check fails)."""
        if self.aux_layer_ids is not None:
            return list(self.aux_layer_ids)
        n = target_num_layers or self.target_num_layers
        if n is None:
            raise EngineError("aux layer ids are the defaults but the target's layer count is "
                              "unknown (pass the target)")
        return serving_default_aux_ids(n)

    def with_(self, **changes: Any) -> Eagle3Config:
        """A copy with some fields changed (validated again)."""
        if self.layer_kind == "mla":  # fields MLA derives follow what they come from
            if "qk_rope_head_dim" in changes:
                changes.setdefault("head_dim", None)
            if "num_attention_heads" in changes:
                changes.setdefault("num_key_value_heads", None)
        return replace(copy.deepcopy(self), **changes)

    # -- config styles -------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict[str, Any], norm_output_meaning: str | None = None
                  ) -> Eagle3Config:
        """Read an EAGLE-style (flat Llama) or speculators-style config dict. A flat config's
        `norm_output` is read as `norm_output_meaning` says (who wrote it; None: unknown)."""
        if not isinstance(d, dict):
            raise EngineError("config is not a JSON object")
        if (bad := nonfinite_field(d)) is not None:  # Python's json reads NaN and Infinity
            raise EngineError(f"config field {bad!r}: not a finite number (NaN or Infinity)")
        if config_style(d) == "speculators":
            layer = d.get("transformer_layer_config")
            if not isinstance(layer, dict):
                raise EngineError("config field 'transformer_layer_config': missing or not an "
                                  "object")
            cfg = _from_llama(layer, top=d, norm_output_meaning="speculators")
            spec = d.get("speculators_config") or {}
            if not isinstance(spec, dict):
                raise EngineError("config field 'speculators_config': not an object")
            verifier = spec.get("verifier") or {}
            cfg.verifier = verifier.get("name_or_path") if isinstance(verifier, dict) else None
            archs = verifier.get("architectures") if isinstance(verifier, dict) else None
            cfg.verifier_architectures = list(archs) if isinstance(archs, list) else None
            for p in spec.get("proposal_methods") or []:
                if isinstance(p, dict) and isinstance(p.get("speculative_tokens"), int):
                    cfg.speculative_tokens = p["speculative_tokens"]
                    break
            # vLLM assumes true when the field is absent; follow the engine that will serve it.
            nbr = d.get("norm_before_residual", True)
            if not isinstance(nbr, bool):
                raise EngineError(f"config field 'norm_before_residual': {nbr!r} is not a bool")
            cfg.norm_before_residual = nbr
            cfg.__post_init__()
            return cfg
        return _from_llama(d, top=d, norm_output_meaning=norm_output_meaning)

    def _llama_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model_type": "llama",
            "num_hidden_layers": 1,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": copy.deepcopy(self.rope_scaling),
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
            "torch_dtype": self.torch_dtype,
        }
        out.update(copy.deepcopy(self.extra))
        return out

    def to_eagle_dict(self) -> dict[str, Any]:
        """The EAGLE-style config.json that vLLM and SGLang both load."""
        if self.norm_before_residual and self.layer_kind != "mla":
            raise EngineError("config field 'norm_before_residual' is true: EAGLE-style engines "
                              "(vLLM/SGLang llama_eagle3) cannot express it; keep speculators "
                              "style")
        if self.layer_kind == "mla":
            out = {"architectures": [MLA_ARCH], **self._mla_dict(),
                   "draft_vocab_size": self.draft_vocab_size}
        else:
            out = {"architectures": [EAGLE_ARCH], **self._llama_dict(),
                   "draft_vocab_size": self.draft_vocab_size}
        if self.target_hidden_size != self.hidden_size:
            out["target_hidden_size"] = self.target_hidden_size
        if self.aux_layer_ids is not None and not self._aux_are_defaults():
            # vLLM reads the top-level field (id k = input of layer k); SGLang and SpecForge read
            # eagle_config's (id k = output of layer k), so that copy is shifted down by one.
            out["eagle_aux_hidden_state_layer_ids"] = list(self.aux_layer_ids)
            if min(self.aux_layer_ids) >= 1:
                out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids":
                                       [k - 1 for k in self.aux_layer_ids]}
        out.update(self._extra_norm_flags())
        if self.target_num_layers is not None:
            out["target_num_hidden_layers"] = self.target_num_layers
        return out

    def _mla_dict(self) -> dict[str, Any]:
        """The flat DeepSeek layer config vLLM's Eagle3DeepseekV2ForCausalLM reads (through
        transformers' DeepseekV2Config: head_dim is derived there, so not written)."""
        out = self._llama_dict()
        del out["head_dim"], out["mlp_bias"]
        # deepseek_v2, not _v3: vLLM 0.32 turns a deepseek_v3 draft config into its MTP model
        # (SpeculativeConfig.hf_config_override) whatever `architectures` says
        out["model_type"] = "deepseek_v2"
        out.update({k: getattr(self, k) for k in MLA_FIELDS})
        out["rope_interleave"] = True  # vLLM's MLA RoPE is GPT-J style (is_neox_style=False)
        rs = out["rope_scaling"]
        if rs is not None and "original_max_position_embeddings" not in rs:
            # what our yarn used; vLLM's deepseek_yarn requires the key
            rs["original_max_position_embeddings"] = self.max_position_embeddings
        if self.norm_before_residual:  # deepseek_eagle3 reads it from the flat config
            out["norm_before_residual"] = True
        return out

    def _extra_norm_flags(self) -> dict[str, bool]:
        # Written only when used, at the top level where vLLM's llama/deepseek_eagle3 and its
        # speculators adapter read all three; older engines never see them.
        return {k: True for k in NORM_FLAGS if getattr(self, k)}

    def to_speculators_dict(self, verifier: str | None = None,
                            speculative_tokens: int | None = None,
                            verifier_architectures: list[str] | None = None) -> dict[str, Any]:
        """The speculators-style config.json; `norm_before_residual` always written explicitly."""
        if self.layer_kind == "mla":
            raise EngineError("speculators: an MLA drafter (kv_lora_rank) cannot be expressed "
                              "in the speculators style (vLLM's speculators adapter builds "
                              "llama/qwen3 layers only); export --to vllm or eagle")
        name = verifier if verifier is not None else self.verifier
        k = speculative_tokens if speculative_tokens is not None else self.speculative_tokens
        _positive_int("speculative_tokens", k)
        archs = verifier_architectures or self.verifier_architectures or []
        layer = {"architectures": ["LlamaForCausalLM"], **self._llama_dict()}
        aux = None if self.aux_layer_ids is None or self._aux_are_defaults() else list(
            self.aux_layer_ids)
        out: dict[str, Any] = {
            "speculators_model_type": "eagle3",
            "architectures": [SPECULATORS_ARCH],
            "transformer_layer_config": layer,
            "draft_vocab_size": self.draft_vocab_size,
            "norm_before_residual": self.norm_before_residual,
            "target_hidden_size": (None if self.target_hidden_size == self.hidden_size
                                   else self.target_hidden_size),
            "eagle_aux_hidden_state_layer_ids": aux,
            "speculators_version": SPECULATORS_VERSION,
            "speculators_config": {
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k,
                                      "verifier_accept_k": 1}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": name, "architectures": list(archs)},
            },
            "torch_dtype": self.torch_dtype,
        }
        # speculators 0.9 writes all three at the top level, false included (vLLM's adapter
        # reads them there, default false).
        out.update({k: bool(getattr(self, k)) for k in NORM_FLAGS})
        if self.target_num_layers is not None:
            out["target_num_hidden_layers"] = self.target_num_layers
        return out

    def to_plain(self) -> dict[str, Any]:
        """All fields as plain data (for --json output and provenance)."""
        return asdict(self)

    def _aux_are_defaults(self) -> bool:
        """Whether the ids are what a serving engine computes when the config omits them (so
        they may be omitted): 2, N//2, N-3, and distinct."""
        return (self.target_num_layers is not None and self.aux_layer_ids is not None
                and self.aux_layer_ids == serving_default_aux_ids(self.target_num_layers)
                and aux_ids_problem(self.aux_layer_ids) is None)


def serving_default_aux_ids(n: int) -> list[int]:
    """The inputs of decoder layers 2, N//2 and N-3 (vLLM convention), what vLLM
    and SGLang compute when a drafter's config names no ids. Below 7 layers two of them meet."""
    return [2, n // 2, n - 3]


def repeated_aux_ids(ids: list[int]) -> list[int]:
    """The ids that occur more than once. vLLM de-duplicates a drafter's aux ids
    (`sorted(set(...))`) and hands fewer states than fc was built for: its first speculative
    step then fails."""
    return sorted({i for i in ids if ids.count(i) > 1})


def aux_ids_problem(ids: list[int]) -> str | None:
    """What vLLM would get wrong about these ids: repeats (it de-duplicates them) or an order
    other than ascending (it sorts them, so fc's column blocks would meet other layers)."""
    rep = repeated_aux_ids(ids)
    if rep:
        return f"repeat {rep}: vLLM de-duplicates them and feeds {len(set(ids))} states to an " \
               f"fc built for {len(ids)}"
    if ids != sorted(ids):
        return "are not ascending: vLLM sorts them, so fc's column blocks would meet other layers"
    return None


def default_aux_layer_ids(n: int) -> list[int]:
    """The ids the engine captures and trains with: the serving defaults, or, where two of them
    meet or fall out of order (fewer than 7 layers), the nearest distinct ascending layers (6
    layers: 2, 3, 4)."""
    if n < 3:
        raise EngineError(f"a target with {n} decoder layer(s) has no 3 distinct aux layers")
    ids = serving_default_aux_ids(n)
    for i in (1, 2):
        ids[i] = max(ids[i], ids[i - 1] + 1)
    ids[2] = min(ids[2], n - 1)
    ids[1] = min(ids[1], ids[2] - 1)
    ids[0] = max(0, min(ids[0], ids[1] - 1))
    return ids


def config_style(d: dict[str, Any]) -> str:
    """'speculators' when the dict carries speculators fields, else 'eagle'."""
    if "speculators_model_type" in d or "speculators_config" in d or \
            "transformer_layer_config" in d:
        return "speculators"
    return "eagle"


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


def _positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise EngineError(f"config field {name!r}: {value!r} must be a positive integer")


#: rope_scaling's numeric sub-fields: (whole numbers only, lowest, highest). The ranges are
#: what any model ships (Kimi's yarn factor 64, llama3's 8, beta_fast 32, mscale 0.707-1)
#: with room to spare; past them a field is corrupt, and a NaN or a string would reach the
#: RoPE tables (blocks.py) as a TypeError or as NaN attention.
ROPE_NUMBERS: dict[str, tuple[bool, float, float]] = {
    "factor": (False, 1e-3, 1e4),
    "original_max_position_embeddings": (True, 1, 2**31 - 1),
    "low_freq_factor": (False, 1e-3, 1e4), "high_freq_factor": (False, 1e-3, 1e4),
    "beta_fast": (False, 0, 1e4), "beta_slow": (False, 0, 1e4),
    "mscale": (False, 0, 100), "mscale_all_dim": (False, 0, 100),
    "attention_factor": (False, 1e-3, 100),
}
ROPE_NEEDS = {"linear": ("factor",), "yarn": ("factor",),
              "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings")}


def _rope_number(key: str, v: Any) -> None:
    whole, lo, hi = ROPE_NUMBERS[key]
    kind = "an integer" if whole else "a number"
    ok = (isinstance(v, int) if whole else isinstance(v, (int, float))) \
        and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi
    if not ok:
        raise EngineError(f"config field 'rope_scaling.{key}': {v!r} must be {kind} from "
                          f"{lo:g} to {hi:g}")


def _check_rope(rs: Any) -> dict[str, Any] | None:
    if rs is None:
        return None
    if not isinstance(rs, dict):
        raise EngineError(f"config field 'rope_scaling': {rs!r} is not an object")
    rs = dict(rs)
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise EngineError(f"config field 'rope_scaling.rope_type': {kind!r} is not supported "
                          f"({', '.join(ROPE_TYPES)})")
    rs["rope_type"] = kind
    if kind == "default":
        return None
    for key in ROPE_NEEDS[kind]:
        if rs.get(key) is None:
            raise EngineError(f"config field 'rope_scaling.{key}': missing (rope_type {kind!r} "
                              "needs it)")
    for key in ROPE_NUMBERS:
        if rs.get(key) is not None:  # null is how configs leave an optional one unset
            _rope_number(key, rs[key])
    if kind == "llama3" and rs["high_freq_factor"] <= rs["low_freq_factor"]:
        raise EngineError(f"config field 'rope_scaling.high_freq_factor': "
                          f"{rs['high_freq_factor']!r} must exceed low_freq_factor "
                          f"{rs['low_freq_factor']!r}")
    return rs


CONFIG_FIELDS = tuple(f.name for f in fields(Eagle3Config))
