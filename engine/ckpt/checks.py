"""What `inspect` checks and `convert`/`save` refuse: a drafter's tensors against its config
(names, shapes, dtypes, the vocab map), and what each export target would mis-load.

    expected_tensors(cfg) -> {canonical name: Expect}
    run_checks(ckpt) -> list[Check]      the `inspect` checks (streams each float tensor's bytes
                                         once for the finiteness check, in bounded chunks)
    require_checks(ckpt)                 the first failing check as the one-line error
    require_finite(tensors, where)       refuses NaN/inf weights (what train will not save)
    load_drafter(dir) -> (Eagle3Config, canonical state dict, Detected)   raises on any failed check
    export_checks(cfg, names, to) -> warnings   refuses what the chosen engine would mis-load
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.ckpt.config_styles import NORM_FLAGS, to_eagle_dict, to_speculators_dict
from engine.ckpt.drafter_dir import Checkpoint, open_checkpoint
from engine.ckpt.key_map import (
    EXPORT_TARGETS,
    Detected,
    from_canonical,
    output_style,
    to_canonical,
)
from engine.ckpt.safetensors_io import FLOAT_CODES, torch_dtype
from engine.errors import EngineError
from engine.model.config import Eagle3Config, aux_ids_problem


@dataclass(frozen=True)
class Expect:
    """What config.json implies for one canonical tensor."""

    shape: tuple[int, ...]
    formula: str  # the config fields the shape comes from, for error messages
    kind: str  # "float" | "int64" | "bool"
    required: bool


def expected_tensors(cfg: Eagle3Config) -> dict[str, Expect]:
    """Canonical name -> expected shape/kind for this config (the draft layer, its vocab maps
    and each style's names)."""
    H, Ht, Im, V, Vd = (cfg.hidden_size, cfg.target_hidden_size, cfg.intermediate_size,
                       cfg.vocab_size, cfg.draft_vocab_size)
    assert Ht is not None and Vd is not None and cfg.head_dim and cfg.num_key_value_heads
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    f = "float"
    e: dict[str, Expect] = {
        "fc.weight": Expect((H, 3 * Ht), "[hidden_size, 3*target_hidden_size]", f, True),
        "midlayer.hidden_norm.weight": Expect((H,), "[hidden_size]", f, True),
        "midlayer.input_layernorm.weight": Expect((H,), "[hidden_size]", f, True),
        "midlayer.self_attn.q_proj.weight": Expect(
            (q, 2 * H), "[num_attention_heads*head_dim, 2*hidden_size]", f, True),
        "midlayer.self_attn.k_proj.weight": Expect(
            (kv, 2 * H), "[num_key_value_heads*head_dim, 2*hidden_size]", f, True),
        "midlayer.self_attn.v_proj.weight": Expect(
            (kv, 2 * H), "[num_key_value_heads*head_dim, 2*hidden_size]", f, True),
        "midlayer.self_attn.o_proj.weight": Expect(
            (H, q), "[hidden_size, num_attention_heads*head_dim]", f, True),
        "midlayer.post_attention_layernorm.weight": Expect((H,), "[hidden_size]", f, True),
        "midlayer.mlp.gate_proj.weight": Expect((Im, H), "[intermediate_size, hidden_size]", f,
                                                True),
        "midlayer.mlp.up_proj.weight": Expect((Im, H), "[intermediate_size, hidden_size]", f, True),
        "midlayer.mlp.down_proj.weight": Expect((H, Im), "[hidden_size, intermediate_size]", f,
                                                True),
        "norm.weight": Expect((H,), "[hidden_size]", f, True),
        "lm_head.weight": Expect((Vd, H), "[draft_vocab_size, hidden_size]", f, True),
        "d2t": Expect((Vd,), "[draft_vocab_size]", "int64", cfg.has_vocab_map),
        "t2d": Expect((V,), "[vocab_size]", "bool", False),
        "embed_tokens.weight": Expect((V, H), "[vocab_size, hidden_size]", f, False),
        "input_norm.weight": Expect((3 * Ht,), "[3*target_hidden_size]", f, cfg.norm_before_fc),
    }
    for i in range(3):
        e[f"fc_norm.{i}.weight"] = Expect((Ht,), "[target_hidden_size]", f, cfg.fc_norm)
    if cfg.layer_kind == "mla":
        for n in ("q", "k", "v", "o"):
            del e[f"midlayer.self_attn.{n}_proj.weight"]
        e.update(_mla_tensors(cfg))
    return e


def _mla_tensors(cfg: Eagle3Config) -> dict[str, Expect]:
    """The MLA attention's tensors (engine/model/mla_layer.py), shapes per config field."""
    H, nh, q_lora, kv_lora = (cfg.hidden_size, cfg.num_attention_heads, cfg.q_lora_rank,
                              cfg.kv_lora_rank)
    nope, rope, vd = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    assert kv_lora is not None and nope is not None and rope is not None and vd is not None
    a, f = "midlayer.self_attn.", "float"
    qk = "num_attention_heads*(qk_nope_head_dim+qk_rope_head_dim)"
    e = {
        a + "kv_a_proj_with_mqa.weight": Expect(
            (kv_lora + rope, 2 * H), "[kv_lora_rank+qk_rope_head_dim, 2*hidden_size]", f, True),
        a + "kv_a_layernorm.weight": Expect((kv_lora,), "[kv_lora_rank]", f, True),
        a + "kv_b_proj.weight": Expect(
            (nh * (nope + vd), kv_lora),
            "[num_attention_heads*(qk_nope_head_dim+v_head_dim), kv_lora_rank]", f, True),
        a + "o_proj.weight": Expect((H, nh * vd), "[hidden_size, num_attention_heads*v_head_dim]",
                                    f, True),
    }
    if q_lora is None:
        e[a + "q_proj.weight"] = Expect((nh * (nope + rope), 2 * H), f"[{qk}, 2*hidden_size]", f,
                                        True)
    else:
        e[a + "q_a_proj.weight"] = Expect((q_lora, 2 * H), "[q_lora_rank, 2*hidden_size]", f,
                                          True)
        e[a + "q_a_layernorm.weight"] = Expect((q_lora,), "[q_lora_rank]", f, True)
        e[a + "q_b_proj.weight"] = Expect((nh * (nope + rope), q_lora), f"[{qk}, q_lora_rank]",
                                          f, True)
    return e


@dataclass(frozen=True)
class Check:
    """One inspect check. `error` is the one line convert stops with when it fails."""

    name: str
    ok: bool
    detail: str
    error: str | None = None
    serving_only: bool = False
    """A failure that only stops serving the directory as it is (`convert` fixes it): reading,
    finetuning and converting go on (require_checks skips it)."""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


def run_checks(ck: Checkpoint) -> list[Check]:
    cfg = ck.config
    exp = expected_tensors(cfg)
    cfg_file = str(ck.path / "config.json")
    checks: list[Check] = []

    unknown = sorted(ck.stored[c] for c in ck.stored if c not in exp)
    checks.append(Check("unknown_keys", not unknown,
                        "none" if not unknown else ", ".join(unknown),
                        None if not unknown else
                        f"{ck.where(to_canonical(unknown[0], ck.detected.key_style))}: unknown "
                        f"tensor {unknown[0]!r} (not an EAGLE-3 {ck.detected.key_style} name)"))

    missing = [c for c, x in exp.items() if x.required and c not in ck.stored]
    names = [from_canonical(c, ck.detected.key_style) for c in missing]
    checks.append(Check("required", not missing, "all present" if not missing else
                        "missing " + ", ".join(names),
                        None if not missing else
                        f"{ck.where()}: missing required tensor {names[0]!r}"))

    bad: list[str] = []
    first_err = None
    for c, x in exp.items():
        if c not in ck.stored:
            continue
        e = ck.entry(c)
        kind_ok = {"float": e.dtype in FLOAT_CODES, "int64": e.dtype == "I64",
                   "bool": e.dtype == "BOOL"}[x.kind]
        if e.shape != x.shape or not kind_ok:
            what = (f"shape {list(e.shape)} but config says {list(x.shape)} = {x.formula}"
                    if e.shape != x.shape else f"dtype {e.dtype}, expected {x.kind}")
            bad.append(f"{e.name}: {what}")
            first_err = first_err or f"{e.file}: tensor {e.name!r} has {what} ({cfg_file})"
    checks.append(Check("shapes", not bad, "all match config" if not bad else "; ".join(bad),
                        first_err))
    checks.append(_vocab_check(ck, shapes_ok=not bad))
    checks.append(_aux_check(cfg, cfg_file))

    checks.append(_finite_check(ck, exp))
    if "embed_tokens.weight" in ck.stored:
        e = ck.entry("embed_tokens.weight")
        emb = f"present {list(e.shape)} {e.dtype}"
    else:
        emb = "absent (the serving engine takes the target's embedding)"
    checks.append(Check("embedding", True, emb))

    if ck.detected.format == "mixed" and ck.detected.config_style == "eagle" and \
            cfg.layer_kind == "llama":  # an MLA drafter is vLLM's alone, and vLLM renames
        checks.append(Check("serving_names", False, "EAGLE-style config with layers.0.* names: "
                            "SGLang silently ignores them (convert --to sglang)",
                            f"{ck.where()}: layers.0.* names under an EAGLE-style config"))
    checks.append(norm_flags_check(ck))
    if cfg.layer_kind == "mla":
        checks.append(_mla_serving_check(ck.config_dict))
    if ck.detected.config_style == "speculators":
        has = "norm_before_residual" in ck.config_dict
        checks.append(Check("norm_before_residual", has,
                            str(cfg.norm_before_residual).lower() if has else
                            "absent: vLLM assumes true (write it explicitly)",
                            None if has else
                            f"{cfg_file}: field 'norm_before_residual' missing"))
    return checks


def nonfinite_count(t: torch.Tensor, chunk: int = 1 << 24) -> int:
    """NaN and inf values in a float tensor (counted in chunks: float8 is widened to float32
    a chunk at a time, never the whole tensor)."""
    flat, bad = t.reshape(-1), 0
    for a in range(0, flat.numel(), chunk):
        part = flat[a:a + chunk]
        if part.element_size() == 1:
            part = part.float()
        bad += int((~torch.isfinite(part)).sum())
    return bad


def require_finite(tensors: dict[str, torch.Tensor], where: str) -> None:
    """Refuse weights holding NaN or inf, naming the first such tensor (`where` says whose)."""
    for name, t in tensors.items():
        if t.is_floating_point() and (n := nonfinite_count(t.detach())):
            raise EngineError(f"{where}: tensor {name!r} holds {n} non-finite values (NaN or "
                              "inf); not written")


def _finite_check(ck: Checkpoint, exp: dict[str, Expect]) -> Check:
    """Every float tensor finite: a diverged run's NaN weights load and serve without error,
    and only draft garbage."""
    for c in sorted(ck.stored):
        x = exp.get(c)
        if x is None or x.kind != "float" or ck.entry(c).dtype not in FLOAT_CODES:
            continue
        e = ck.entry(c)
        dtype = torch_dtype(e.dtype)
        n = sum(nonfinite_count(torch.frombuffer(chunk, dtype=dtype))  # streamed: bounded memory
                for chunk in ck.weights.raw_chunks(e.name, 1 << 20) if len(chunk))
        if n:
            msg = f"{e.name}: {n} of {e.numel} values are NaN or inf"
            return Check("finite", False, msg, f"{e.file}: tensor {e.name!r} holds {n} "
                         "non-finite values (NaN or inf)")
    return Check("finite", True, "no NaN or inf")


def _aux_check(cfg: Eagle3Config, cfg_file: str) -> Check:
    """The aux layer ids must be distinct: vLLM de-duplicates them and would hand fewer states
    than fc was built for (the first speculative step fails)."""
    n = cfg.target_num_layers
    if cfg.aux_layer_ids is None and n is None:
        return Check("aux_layer_ids", True, "defaults 2, N//2, N-3 (target layers not recorded)")
    ids = cfg.resolved_aux_layer_ids(n)
    problem = aux_ids_problem(ids)
    if problem is None:
        return Check("aux_layer_ids", True, f"{ids} distinct, ascending")
    where = ("eagle_aux_hidden_state_layer_ids" if cfg.aux_layer_ids is not None
             else f"the defaults for {n} target layers")
    msg = f"{ids} ({where}) {problem}"
    return Check("aux_layer_ids", False, msg, f"{cfg_file}: aux layer ids {msg}")


def _vocab_check(ck: Checkpoint, shapes_ok: bool) -> Check:
    cfg = ck.config
    V, Vd = cfg.vocab_size, cfg.draft_vocab_size
    assert Vd is not None
    if "d2t" not in ck.stored:
        if cfg.has_vocab_map:
            return Check("vocab_map", False, "d2t missing", f"{ck.where()}: missing tensor 'd2t'")
        return Check("vocab_map", True, "no d2t: draft vocab is the target vocab")
    if not shapes_ok and (ck.entry("d2t").shape != (Vd,) or ck.entry("d2t").dtype != "I64"):
        return Check("vocab_map", False, "d2t has the wrong shape or dtype (see shapes)")
    d2t = ck.load("d2t")
    targets = d2t + torch.arange(Vd)
    f = ck.where("d2t")
    if bool((targets < 0).any() | (targets >= V).any()):
        i = int(((targets < 0) | (targets >= V)).nonzero()[0])
        msg = f"d2t[{i}] maps draft id {i} to target id {int(targets[i])}, outside [0, {V})"
        return Check("vocab_map", False, msg, f"{f}: tensor 'd2t': {msg}")
    if Vd > 1 and not bool((targets[1:] > targets[:-1]).all()):
        i = int((targets[1:] <= targets[:-1]).nonzero()[0]) + 1
        msg = f"d2t targets not strictly ascending at draft id {i}"
        return Check("vocab_map", False, msg, f"{f}: tensor 'd2t': {msg}")
    if "t2d" in ck.stored and ck.entry("t2d").shape == (V,) and ck.entry("t2d").dtype == "BOOL":
        t2d = ck.load("t2d")
        if not torch.equal(t2d.nonzero().flatten(), targets):
            n = int(t2d.sum())
            msg = f"nonzero(t2d) != d2t + arange(Vd) (t2d marks {n} ids, Vd is {Vd})"
            return Check("vocab_map", False, msg, f"{ck.where('t2d')}: tensor 't2d': {msg}")
        return Check("vocab_map", True, f"d2t/t2d consistent, Vd {Vd} of V {V}")
    return Check("vocab_map", True, f"d2t valid, Vd {Vd} of V {V} (no t2d)")


def require_checks(ck: Checkpoint) -> None:
    """Raise the first failing check as the one-line error."""
    for c in run_checks(ck):
        if not c.ok and not c.serving_only:
            raise EngineError(c.error or f"{ck.path}: check {c.name} failed: {c.detail}")


def norm_flags_check(ck: Checkpoint) -> Check:
    """The EAGLE 3.1 flags (`norm_before_fc`, `fc_norm`, `norm_output`) as this engine runs
    them, and any the config does not state although the tensors show it (vLLM drops
    `input_norm` silently when `norm_before_fc` is not in the config; `convert` writes the
    flag)."""
    cfg, conf = ck.config, ck.config_dict
    nested = conf.get("eagle_config")
    eagle: dict[str, Any] = nested if isinstance(nested, dict) else {}
    said = {k for k in NORM_FLAGS if k in conf or k in eagle}
    parts = [f"{k} {str(getattr(cfg, k)).lower()}" for k in NORM_FLAGS]
    silent = [k for k in ("norm_before_fc", "fc_norm") if getattr(cfg, k) and k not in said]
    if silent:
        parts.append(f"({', '.join(silent)} from the tensors: the config does not say)")
    return Check("norm_flags", True, " · ".join(parts))


def load_drafter(d: Path) -> tuple[Eagle3Config, dict[str, torch.Tensor], Detected]:
    """Any style -> (config, canonical state dict, detected style). Raises on a failed check."""
    ck = open_checkpoint(Path(d))
    require_checks(ck)
    sd = {c: ck.weights.load(n) for c, n in ck.stored.items()}
    return ck.config, sd, ck.detected


def export_checks(cfg: Eagle3Config, canonical: list[str], to: str) -> list[str]:
    """Refuse what the chosen engine would mis-load; returns warnings for what it may not read."""
    if to not in EXPORT_TARGETS:
        raise EngineError(f"unknown export target {to!r} (one of {', '.join(EXPORT_TARGETS)})")
    warnings: list[str] = []
    if to == "speculators" and not cfg.verifier:
        raise EngineError("speculators: the verifier is unknown (pass --verifier NAME_OR_PATH; "
                          "vLLM requires speculators_config.verifier.name_or_path)")
    if to == "speculators" and cfg.norm_before_fc and cfg.fc_norm:
        raise EngineError("speculators: norm_before_fc and fc_norm both on (speculators 0.9 "
                          "refuses the pair; vLLM runs it: export --to vllm)")
    if cfg.layer_kind == "mla":
        _mla_export_check(cfg, to)
    if output_style(to) == "eagle":
        to_eagle_dict(cfg)  # raises for norm_before_residual: true
    if to in ("vllm", "sglang"):
        if cfg.has_vocab_map and "d2t" not in canonical:
            raise EngineError(f"{to}: draft_vocab_size != vocab_size needs a d2t tensor")
        extras = [c for c in canonical if c.startswith(("fc_norm.", "input_norm."))]
        if extras:
            warnings.append(f"{to}: {extras[0]} needs a {to} release that reads "
                            "norm_before_fc/fc_norm")
    if to == "sglang" and cfg.norm_output:  # SGLang's key means SpecForge's, not 3.1's
        raise EngineError("sglang: norm_output (EAGLE 3.1: the post-norm state goes to the next "
                          "step) cannot be expressed for SGLang; export --to vllm or speculators")
    if to == "sglang":
        names = [from_canonical(c, "eagle") for c in canonical]
        layer = [n for n in names if n.startswith("layers.")]
        if layer:  # SGLang drops these silently and runs a random layer
            raise EngineError(f"sglang: tensor {layer[0]!r} is not a midlayer.* name")
        if cfg.aux_layer_ids is not None and "eagle_config" not in to_eagle_dict(cfg):
            warnings.append("sglang: aux layer ids include 0; SGLang cannot express them")
    return warnings


def _mla_serving_check(conf: dict[str, Any]) -> Check:
    """Whether vLLM 0.32 builds its Eagle3DeepseekV2ForCausalLM from this config as written:
    TorchSpec writes `model_type: "deepseek_v3"` (vLLM turns such a draft into its DeepSeek MTP
    model) and its own architecture name (not registered in vLLM)."""
    archs, mtype = conf.get("architectures") or [], conf.get("model_type")
    bad = []
    if mtype == "deepseek_v3":
        bad.append("model_type deepseek_v3 (vLLM 0.32 serves it as its DeepSeek MTP model)")
    if not any(a in ("Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM")
               for a in archs if isinstance(a, str)):
        bad.append(f"architectures {archs} (vLLM knows Eagle3DeepseekV2ForCausalLM)")
    if not bad:
        return Check("vllm_mla_config", True, f"{archs[0]}, model_type {mtype}")
    return Check("vllm_mla_config", False, "; ".join(bad) + ": convert --to vllm rewrites it",
                 serving_only=True)


def _mla_export_check(cfg: Eagle3Config, to: str) -> None:
    """An MLA drafter is served by vLLM's Eagle3DeepseekV2ForCausalLM alone."""
    if to == "speculators":
        to_speculators_dict(cfg)  # raises, naming why
    if to == "sglang":
        raise EngineError("sglang: an MLA drafter (kv_lora_rank) cannot be expressed for SGLang "
                          "(its llama_eagle3 builds a Llama layer and ignores the MLA tensors); "
                          "export --to vllm")
    if to == "vllm" and cfg.q_lora_rank is None:
        raise EngineError("vllm: an MLA drafter without q_lora_rank: vLLM 0.32's "
                          "Eagle3DeepseekV2ForCausalLM loader maps kv_a_proj_with_mqa into "
                          "fused_qkv_a_proj, which it builds only with q_lora_rank (the load "
                          "fails)")
    if cfg.norm_before_fc:
        raise EngineError(f"{to}: an MLA drafter with norm_before_fc: vLLM's "
                          "Eagle3DeepseekV2ForCausalLM has no input_norm (it would refuse the "
                          "tensor)")
