"""The drafter's typed config, `Eagle3Config`: the fields that fix its shapes and math, their
validation, and the aux-layer-id conventions (named presets: engine/model/presets.py; the two
on-disk config styles it is read from and written to: engine/ckpt/config_styles.py).

Re-exported by engine/model/draft.py; kept apart so the model file reads as the math only.

Layer kinds (`Eagle3Config.layer_kind`): "llama" (the EAGLE-3 layer) or "mla" (DeepSeek-V2/V3
multi-head latent attention), told by `kv_lora_rank`. Problems raise EngineError naming the
field; callers prefix the file name.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from engine.errors import EngineError

MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
              "v_head_dim")
ROPE_TYPES = ("default", "linear", "llama3", "yarn")
DTYPES = ("float32", "float16", "bfloat16")


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
    """Llama keys we carry through untouched (engine/ckpt/config_styles.py PASSTHROUGH_KEYS)."""

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"):
            positive_int(name, getattr(self, name))
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
            positive_int(name, getattr(self, name))
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
            positive_int("target_num_layers", self.target_num_layers)
        if self.torch_dtype not in DTYPES:
            raise EngineError(f"config field 'torch_dtype': {self.torch_dtype!r} is not one of "
                              f"{', '.join(DTYPES)}")

    def _check_mla(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(self, name) is None:
                raise EngineError(f"config field {name!r}: missing (an MLA drafter: "
                                  "kv_lora_rank is set)")
            positive_int(name, getattr(self, name))
        if self.q_lora_rank is not None:
            positive_int("q_lora_rank", self.q_lora_rank)
        if self.head_dim is None:
            self.head_dim = self.qk_rope_head_dim
        if self.head_dim != self.qk_rope_head_dim:
            raise EngineError(f"config field 'head_dim': {self.head_dim} != qk_rope_head_dim "
                              f"{self.qk_rope_head_dim} (an MLA drafter's RoPE width)")
        if self.num_key_value_heads not in (None, self.num_attention_heads):
            raise EngineError(f"config field 'num_key_value_heads': {self.num_key_value_heads} "
                              "!= num_attention_heads (MLA has one key/value per head)")
        rs = self.rope_scaling if isinstance(self.rope_scaling, dict) else {}  # _check_rope names
        kind = rs.get("rope_type", rs.get("type"))
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

    def to_plain(self) -> dict[str, Any]:
        """All fields as plain data (for --json output and provenance)."""
        return asdict(self)


def serving_default_aux_ids(n: int) -> list[int]:
    """The inputs of decoder layers 2, N//2 and N-3 (vLLM convention), what vLLM and SGLang
    compute when a drafter's config names no ids (docs/eagle3.md#aux-layer-ids). Below 7 layers
    two of them meet."""
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


def positive_int(name: str, value: Any) -> None:
    """Refuse anything but a positive int (a bool is not one), naming the config field."""
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
