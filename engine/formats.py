"""Checkpoint styles: detection, the declarative key map, config files, checks, load and save.

Styles (spec section 4)
    eagle        `midlayer.*` names, flat Llama config (EAGLE, SpecForge, AQ-MedAI; what vLLM and
                 SGLang both load; `vllm` and `sglang` exports are this style plus engine checks)
    speculators  `layers.0.*` names, config with `speculators_model_type` and
                 `transformer_layer_config`
The canonical names are the EAGLE ones (engine/model.py). The only key difference between styles
is the layer prefix, so the map is one table, LAYER_PREFIX, with `to_*` / `from_*` directions:
    from_speculators(sd) / to_speculators(sd) / from_eagle(sd) / to_eagle(sd)
work on any name -> value mapping (tensors, file entries, shapes).

Library entry points (used by convert, inspect, vocab remap and the trainer):
    open_checkpoint(dir) -> Checkpoint   config + weight index + detected style, nothing loaded
    run_checks(ckpt) -> list[Check]      the `inspect` checks (loads only d2t/t2d)
    load_drafter(dir) -> (Eagle3Config, canonical state dict, Detected)   raises on any failed check
    load_target_embedding(target_dir, cfg) -> the target's [V, H] embedding (for
                                         Eagle3Draft.set_embedding)
    save_drafter(dst, cfg, state_dict, style, ...)   whole-dict save, atomic (temp dir + rename)
    atomic_output_dir(dst, force)        the temp-dir-then-rename context manager itself
                                         (engine/output_dir.py: what an output may delete)
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from engine import __version__
from engine.draft_config import Eagle3Config, config_style
from engine.errors import EngineError
from engine.output_dir import atomic_output_dir
from engine.safetensors_io import (
    FLOAT_CODES,
    Entry,
    WeightSet,
    open_weights,
    read_regular_text,
    reason,
    save_tensors,
    torch_dtype,
)

STYLES = ("eagle", "speculators")
EXPORT_TARGETS = ("eagle", "speculators", "vllm", "sglang")
# The whole key map: the decoder layer's prefix per style. Everything else has the same name.
LAYER_PREFIX = {"eagle": "midlayer.", "speculators": "layers.0."}
CANONICAL = "eagle"
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some trainers save; no engine loads them
# Where a TARGET model keeps its input embedding (HF Llama-likes, and multimodal wrappers).
TARGET_EMBED_NAMES = ("model.embed_tokens.weight", "embed_tokens.weight",
                      "model.language_model.embed_tokens.weight",
                      "language_model.model.embed_tokens.weight")

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
class Expect:
    """What config.json implies for one canonical tensor."""

    shape: tuple[int, ...]
    formula: str  # the config fields the shape comes from, for error messages
    kind: str  # "float" | "int64" | "bool"
    required: bool


def expected_tensors(cfg: Eagle3Config) -> dict[str, Expect]:
    """Canonical name -> expected shape/kind for this config (spec sections 1, 3, 4)."""
    # the spec's letters (I: the intermediate size)
    H, Ht, I, V, Vd = (cfg.hidden_size, cfg.target_hidden_size,  # noqa: E741
                       cfg.intermediate_size, cfg.vocab_size, cfg.draft_vocab_size)
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
        "midlayer.mlp.gate_proj.weight": Expect((I, H), "[intermediate_size, hidden_size]", f,
                                                True),
        "midlayer.mlp.up_proj.weight": Expect((I, H), "[intermediate_size, hidden_size]", f, True),
        "midlayer.mlp.down_proj.weight": Expect((H, I), "[hidden_size, intermediate_size]", f,
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
    return e


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


def read_config(d: Path) -> tuple[dict[str, Any], Eagle3Config]:
    """config.json as a dict and as a validated Eagle3Config (errors name the file and field)."""
    path = d / "config.json"
    try:
        raw = read_regular_text(path)  # never blocks on a FIFO
    except FileNotFoundError:
        raise EngineError(f"{path}: missing") from None
    except OSError as e:
        raise EngineError(f"{path}: cannot read ({reason(e)})") from e
    except UnicodeDecodeError as e:
        raise EngineError(f"{path}: cannot read ({e})") from e
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise EngineError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise EngineError(f"{path}: not a JSON object")
    try:
        return data, Eagle3Config.from_dict(data)
    except EngineError as e:
        raise EngineError(f"{path}: {e}") from None


@dataclass
class Checkpoint:
    """A drafter directory opened for reading: nothing but d2t/t2d is ever loaded eagerly."""

    path: Path
    config_dict: dict[str, Any]
    config: Eagle3Config
    detected: Detected
    weights: WeightSet
    stored: dict[str, str]  # canonical name -> stored name (ignored buffers left out)
    ignored: list[str] = field(default_factory=list)

    def entry(self, canonical: str) -> Entry:
        return self.weights.entries[self.stored[canonical]]

    def load(self, canonical: str) -> torch.Tensor:
        return self.weights.load(self.stored[canonical])

    def where(self, canonical: str | None = None) -> str:
        """The file a tensor lives in (or the weight file for a missing one)."""
        if canonical is not None and canonical in self.stored:
            return str(self.entry(canonical).file)
        return str(self.weights.files[0]) if len(self.weights.files) == 1 else str(
            self.path / "model.safetensors.index.json")


def open_checkpoint(d: Path) -> Checkpoint:
    d = Path(d)
    weights = open_weights(d)
    config_dict, cfg = read_config(d)
    names = weights.names()
    det = detect(names, config_dict, str(d))
    stored: dict[str, str] = {}
    ignored: list[str] = []
    for n in names:
        if n.endswith(IGNORED_SUFFIXES):
            ignored.append(n)
            continue
        stored[to_canonical(n, det.key_style)] = n
    # Optional fc norms are recognised by their tensors even when the config is silent.
    changes = {}
    if "input_norm.weight" in stored and not cfg.norm_before_fc:
        changes["norm_before_fc"] = True
    if "fc_norm.0.weight" in stored and not cfg.fc_norm:
        changes["fc_norm"] = True
    if changes:
        cfg = cfg.with_(**changes)
    return Checkpoint(d, config_dict, cfg, det, weights, stored, ignored)


@dataclass(frozen=True)
class Check:
    """One inspect check. `error` is the one line convert stops with when it fails."""

    name: str
    ok: bool
    detail: str
    error: str | None = None

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

    if "embed_tokens.weight" in ck.stored:
        e = ck.entry("embed_tokens.weight")
        emb = f"present {list(e.shape)} {e.dtype}"
    else:
        emb = "absent (the serving engine takes the target's embedding)"
    checks.append(Check("embedding", True, emb))

    if ck.detected.format == "mixed" and ck.detected.config_style == "eagle":
        checks.append(Check("serving_names", False, "EAGLE-style config with layers.0.* names: "
                            "SGLang silently ignores them (convert --to sglang)",
                            f"{ck.where()}: layers.0.* names under an EAGLE-style config"))
    if ck.detected.config_style == "speculators":
        has = "norm_before_residual" in ck.config_dict
        checks.append(Check("norm_before_residual", has,
                            f"{cfg.norm_before_residual}" if has else
                            "absent: vLLM assumes true (write it explicitly)",
                            None if has else
                            f"{cfg_file}: field 'norm_before_residual' missing"))
    return checks


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


def find_target_embedding(target: Path) -> tuple[WeightSet, str]:
    ws = open_weights(Path(target))
    for n in TARGET_EMBED_NAMES:
        if n in ws.entries:
            return ws, n
    raise EngineError(f"{target}: no embedding tensor (looked for {', '.join(TARGET_EMBED_NAMES)})")


def target_embedding_entry(target: Path, cfg: Eagle3Config) -> tuple[WeightSet, Entry]:
    """Where the target's input embedding is, after checking it is [V, H] for this drafter."""
    ws, name = find_target_embedding(target)
    e = ws.entries[name]
    want = (cfg.vocab_size, cfg.hidden_size)
    if e.shape != want:
        raise EngineError(f"{e.file}: tensor {name!r} has shape {list(e.shape)} but the drafter "
                          f"needs {list(want)} = [vocab_size, hidden_size]")
    return ws, e


def load_target_embedding(target: Path, cfg: Eagle3Config) -> torch.Tensor:
    """The target model's input embedding [V, H], checked against the drafter's config."""
    ws, e = target_embedding_entry(target, cfg)
    return ws.load(e.name)


def require_checks(ck: Checkpoint) -> None:
    """Raise the first failing check as the one-line error."""
    for c in run_checks(ck):
        if not c.ok:
            raise EngineError(c.error or f"{ck.path}: check {c.name} failed: {c.detail}")


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
    if output_style(to) == "eagle":
        cfg.to_eagle_dict()  # raises for norm_before_residual: true
    if to in ("vllm", "sglang"):
        if cfg.has_vocab_map and "d2t" not in canonical:
            raise EngineError(f"{to}: draft_vocab_size != vocab_size needs a d2t tensor")
        extras = [c for c in canonical if c.startswith(("fc_norm.", "input_norm."))]
        if extras:
            warnings.append(f"{to}: {extras[0]} needs a {to} release that reads "
                            "norm_before_fc/fc_norm")
    if to == "sglang":
        names = [from_canonical(c, "eagle") for c in canonical]
        layer = [n for n in names if n.startswith("layers.")]
        if layer:  # SGLang drops these silently and runs a random layer
            raise EngineError(f"sglang: tensor {layer[0]!r} is not a midlayer.* name")
        if cfg.aux_layer_ids is not None and "eagle_config" not in cfg.to_eagle_dict():
            warnings.append("sglang: aux layer ids include 0; SGLang cannot express them")
    return warnings


def config_for(cfg: Eagle3Config, to: str, verifier: str | None = None,
               speculative_tokens: int | None = None) -> dict[str, Any]:
    if output_style(to) == "speculators":
        return cfg.to_speculators_dict(verifier=verifier, speculative_tokens=speculative_tokens)
    return cfg.to_eagle_dict()


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def save_drafter(dst: Path, cfg: Eagle3Config, state_dict: Mapping[str, torch.Tensor],
                 to: str = "eagle", *, include_embed: bool = True, force: bool = False,
                 verifier: str | None = None, speculative_tokens: int | None = None,
                 provenance: dict[str, Any] | None = None) -> list[str]:
    """Save a canonical state dict in a style, atomically. Returns export warnings."""
    sd = {k: v for k, v in state_dict.items()
          if (include_embed or k != "embed_tokens.weight") and not k.endswith(IGNORED_SUFFIXES)}
    exp = expected_tensors(cfg)
    for k, v in sd.items():
        if k not in exp:
            raise EngineError(f"save: unknown tensor {k!r}")
        if tuple(v.shape) != exp[k].shape:
            raise EngineError(f"save: tensor {k!r} has shape {list(v.shape)}, config says "
                              f"{list(exp[k].shape)} = {exp[k].formula}")
    if verifier:
        cfg = cfg.with_(verifier=verifier)
    warnings = export_checks(cfg, list(sd), to)
    style = output_style(to)
    names = {k: from_canonical(k, style) for k in sd}
    conf = config_for(cfg, to, verifier, speculative_tokens)
    with atomic_output_dir(Path(dst), force=force) as tmp:
        save_tensors(tmp / "model.safetensors", {names[k]: v for k, v in sd.items()})
        write_json(tmp / "config.json", conf)
        if provenance is not None:
            write_json(tmp / "provenance.json", {"engine_version": __version__,
                                                 "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                                 "format": to, **provenance})
    return warnings


def cast_code(code: str, dtype: str) -> str:
    """The stored dtype after `--dtype` (only floating tensors change)."""
    if dtype == "keep" or code not in FLOAT_CODES:
        return code
    return {"bf16": "BF16", "fp16": "F16", "fp32": "F32"}[dtype]


def torch_name(code: str) -> str:
    return str(torch_dtype(code)).replace("torch.", "")
