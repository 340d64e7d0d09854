"""What a drafter's files say, as `serve` and `swap` compare them: its config.json read the way
vLLM reads it, a verifier's config.json, and the inspect summary's sizes, tensors and weight
files. The files are the host's: each field is looked up here, once, and a missing or oddly
typed one reads as unknown."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SIZE_FIELDS = ("hidden_size", "target_hidden_size", "intermediate_size", "num_attention_heads",
               "num_key_value_heads", "head_dim", "draft_vocab_size")
FLAG_FIELDS = ("norm_before_fc", "norm_output", "norm_before_residual", "fc_norm")


def _obj(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, dict) else {}


def text_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A target's config with its `text_config` (a multimodal model's) merged over it."""
    return {**cfg, **_obj(cfg.get("text_config"))}


def target_vocab(cfg: Mapping[str, Any]) -> int | None:
    """The vocabulary size a verifier's config.json states."""
    v = text_config(cfg).get("vocab_size")
    return v if isinstance(v, int) else None


def weight_files(report: Mapping[str, Any]) -> list[str]:
    """The weight files an inspect summary lists, sorted."""
    files = report.get("files")
    return sorted(str(f) for f in files) if isinstance(files, list) else []


def verifier_mismatch(draft_cfg: dict[str, Any], target_cfg: dict[str, Any]) -> str | None:
    """Which field of the verifier's config.json does not fit the drafter, or None."""
    t = {**target_cfg, **(target_cfg.get("text_config") or {})}
    if "kv_lora_rank" in t and "vocab_size" not in t:
        return None
    pairs = (("vocab_size", draft_cfg.get("vocab_size"), t.get("vocab_size")),
             ("hidden_size", draft_cfg.get("target_hidden_size") or draft_cfg.get("hidden_size"),
              t.get("hidden_size")))
    for name, want, got in pairs:
        if want is not None and got is not None and want != got:
            return f"{name}: the drafter expects {want}, the verifier has {got}"
    n = t.get("num_hidden_layers")
    ids = draft_cfg.get("aux_layer_ids") or []
    if isinstance(n, int) and any(not 0 <= int(i) <= n for i in ids):
        return f"aux layer ids {ids} do not fit the verifier's {n} layers"
    return None


def drafter_fields(draft_cfg: dict[str, Any]) -> dict[str, Any]:
    """What the drafter's config.json asks vLLM for, read the way vLLM reads it: aux ids from
    the top level, else eagle_config's (None: the target's defaults); norm_before_fc from
    eagle_config, else the top level; norm_output only when the config has it."""
    nested = draft_cfg.get("eagle_config")
    eagle: dict[str, Any] = nested if isinstance(nested, dict) else {}
    aux = draft_cfg.get("eagle_aux_hidden_state_layer_ids") or \
        eagle.get("eagle_aux_hidden_state_layer_ids")
    out: dict[str, Any] = {
        "aux_layer_ids": [int(i) for i in aux] if isinstance(aux, list) and aux else None,
        "norm_before_fc": bool(eagle.get("norm_before_fc", draft_cfg.get("norm_before_fc",
                                                                         False))),
        "draft_vocab_size": draft_cfg.get("draft_vocab_size") or draft_cfg.get("vocab_size")}
    for name in ("fc_norm", "norm_output"):  # vLLM reads these at the top level only
        if name in draft_cfg:
            out[name] = bool(draft_cfg[name])
    return out


def flags_vllm_drops(draft_cfg: dict[str, Any]) -> list[tuple[str, bool, bool]]:
    """EAGLE 3.1 flags the config states where vLLM 0.32 does not read them:
    (name, asked, what vLLM takes). vLLM's llama/deepseek_eagle3 take `norm_before_fc` from
    eagle_config, else the top level, but `fc_norm` and `norm_output` from the top level only
    (default false); a speculators-style config is read at the top level by its adapter."""
    nested = draft_cfg.get("eagle_config")
    eagle: dict[str, Any] = nested if isinstance(nested, dict) else {}
    taken = drafter_fields(draft_cfg)
    out: list[tuple[str, bool, bool]] = []
    for name in ("fc_norm", "norm_output"):
        if name in eagle and bool(eagle[name]) != bool(taken.get(name, False)):
            out.append((name, bool(eagle[name]), bool(taken.get(name, False))))
    return out


def layer_kind(raw: dict[str, Any]) -> str:
    """The drafter's decoder layer: MLA when its config has MLA's low-rank fields."""
    cfg = {**raw, **(raw.get("transformer_layer_config") or {})}
    return "mla" if "kv_lora_rank" in cfg else "llama"


def stated_k(raw: dict[str, Any]) -> int | None:
    """The k a drafter's config.json states, if it states one (speculators' proposal methods,
    or a top-level num_speculative_tokens)."""
    if isinstance(raw.get("num_speculative_tokens"), int):
        return int(raw["num_speculative_tokens"])
    spec = raw.get("speculators_config")
    methods = spec.get("proposal_methods") if isinstance(spec, dict) else None
    for m in methods if isinstance(methods, list) else []:
        if isinstance(m, dict) and isinstance(m.get("speculative_tokens"), int):
            return int(m["speculative_tokens"])
    return None


def facts(report: dict[str, Any], raw: dict[str, Any]) -> dict[str, Any]:
    """What a running server fixes about its drafter, from the inspect report and config.json."""
    cfg = report.get("config") or {}
    out: dict[str, Any] = {"layer kind": layer_kind(raw)}
    for name in SIZE_FIELDS:
        out[name] = cfg.get(name)
    out["target vocab"] = cfg.get("vocab_size")
    fields = drafter_fields(raw)
    out["aux_layer_ids"] = fields["aux_layer_ids"]
    for name in FLAG_FIELDS:
        out[name] = bool(fields.get(name, raw.get(name, cfg.get(name, False))))
    out["tensors"] = {n: tuple(_obj(t).get("shape") or ()) for n, t in
                      _obj(report.get("tensors")).items()}
    return out


