"""Test helpers: real drafter checkpoints on disk, written with the safetensors library itself."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.ckpt.config_styles import to_eagle_dict, to_speculators_dict
from engine.ckpt.key_map import from_canonical
from engine.model.draft import Eagle3Config, Eagle3Draft, preset


def tiny_config(**changes: object) -> Eagle3Config:
    return preset("tiny").with_(**changes)


def random_state(cfg: Eagle3Config, seed: int = 0, embed: bool = False,
                 dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """A canonical state dict with random weights and a non-trivial vocab map."""
    torch.manual_seed(seed)
    m = Eagle3Draft(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_()
    vd, v = cfg.draft_vocab_size, cfg.vocab_size
    assert vd is not None
    ids = torch.randperm(v)[:vd].sort().values  # a sorted subset of the target vocab
    m.d2t.copy_(ids - torch.arange(vd))
    m.t2d.zero_()
    m.t2d[ids] = True
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    if not embed:
        del sd["embed_tokens.weight"]
    return {k: (t.to(dtype) if t.is_floating_point() else t) for k, t in sd.items()}


def write_drafter(d: Path, cfg: Eagle3Config | None = None, style: str = "eagle",
                  state: dict[str, torch.Tensor] | None = None, layout: str = "single",
                  seed: int = 0, embed: bool = False) -> dict[str, torch.Tensor]:
    """Write a drafter dir in `style` with `layout` single | sharded | bin; returns its state."""
    cfg = cfg or tiny_config()
    state = state if state is not None else random_state(cfg, seed, embed)
    d.mkdir(parents=True, exist_ok=True)
    stored = {from_canonical(k, style): v.contiguous() for k, v in state.items()}
    conf = to_speculators_dict(cfg, verifier="tiny/target") if style == "speculators" \
        else to_eagle_dict(cfg)
    (d / "config.json").write_text(json.dumps(conf, indent=2))
    if layout == "single":
        save_file(stored, str(d / "model.safetensors"), metadata={"format": "pt"})
    elif layout == "sharded":
        names = sorted(stored)
        shards = [names[0::2], names[1::2]]
        wmap = {}
        for i, part in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-00002.safetensors"
            save_file({k: stored[k] for k in part}, str(d / fname), metadata={"format": "pt"})
            wmap.update({k: fname for k in part})
        (d / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": wmap}))
    elif layout == "bin":
        torch.save(stored, d / "pytorch_model.bin")
    else:
        raise ValueError(layout)
    return state


def write_target_embedding(d: Path, cfg: Eagle3Config, seed: int = 7) -> torch.Tensor:
    """A stand-in target directory holding model.embed_tokens.weight [V, H] (and a layer)."""
    torch.manual_seed(seed)
    emb = torch.randn(cfg.vocab_size, cfg.hidden_size, dtype=torch.bfloat16)
    d.mkdir(parents=True, exist_ok=True)
    save_file({"model.embed_tokens.weight": emb,
               "model.norm.weight": torch.ones(cfg.hidden_size, dtype=torch.bfloat16)},
              str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"model_type": "llama",
                                               "vocab_size": cfg.vocab_size}))
    return emb


# The attention tensors of an MLA drafter as vLLM's Eagle3DeepseekV2ForCausalLM and TorchSpec's
# DeepSeekForCausalLMEagle3 name them (before vLLM fuses q_a_proj and kv_a_proj_with_mqa).
MLA_ATTENTION_NAMES = ("q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight",
                       "kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight", "kv_b_proj.weight",
                       "o_proj.weight")


def mla_config_dict(hidden: int = 64, vocab: int = 512, draft_vocab: int = 96,
                    target_layers: int = 7) -> dict[str, object]:
    """A flat MLA drafter config.json written as TorchSpec/vLLM write it (by hand here, not by
    the engine): DeepSeek-V3 fields, yarn RoPE spelled `type`, no head_dim."""
    return {
        "architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": hidden, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_hidden_layers": 1, "intermediate_size": 2 * hidden, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 12,
        "qk_rope_head_dim": 8, "v_head_dim": 10, "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        "vocab_size": vocab, "draft_vocab_size": draft_vocab, "tie_word_embeddings": False,
        "target_num_hidden_layers": target_layers, "torch_dtype": "float32",
    }


def write_mla_drafter(d: Path, conf: dict[str, object] | None = None, prefix: str = "midlayer.",
                      seed: int = 0) -> dict[str, torch.Tensor]:
    """A tiny random MLA drafter in TorchSpec's layout (`midlayer.*`; `layers.0.*` is what
    vLLM's loader renames it to): default-initialised weights, a random sorted draft vocab.
    Returns the stored tensors by stored name."""
    conf = conf or mla_config_dict()
    n: dict[str, int] = {k: int(str(conf[k] or 0)) for k in (
        "hidden_size", "vocab_size", "draft_vocab_size", "num_attention_heads", "q_lora_rank",
        "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "intermediate_size")}
    h, v, vd, nh, i = (n["hidden_size"], n["vocab_size"], n["draft_vocab_size"],
                       n["num_attention_heads"], n["intermediate_size"])
    q, kv, nope, rope, vh = (n["q_lora_rank"], n["kv_lora_rank"], n["qk_nope_head_dim"],
                             n["qk_rope_head_dim"], n["v_head_dim"])  # q 0: no q_lora (q_proj)
    torch.manual_seed(seed)

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape) * 0.05

    attn = {"q_a_proj.weight": w(q, 2 * h), "q_a_layernorm.weight": torch.ones(q),
            "q_b_proj.weight": w(nh * (nope + rope), q),
            "kv_a_proj_with_mqa.weight": w(kv + rope, 2 * h),
            "kv_a_layernorm.weight": torch.ones(kv), "kv_b_proj.weight": w(nh * (nope + vh), kv),
            "o_proj.weight": w(h, nh * vh)}
    assert tuple(attn) == MLA_ATTENTION_NAMES
    if not q:
        attn = {"q_proj.weight": w(nh * (nope + rope), 2 * h),
                **{k: t for k, t in attn.items() if not k.startswith("q_")}}
    layer = {**{f"self_attn.{k}": t for k, t in attn.items()},
             "hidden_norm.weight": torch.ones(h), "input_layernorm.weight": torch.ones(h),
             "post_attention_layernorm.weight": torch.ones(h),
             "mlp.gate_proj.weight": w(i, h), "mlp.up_proj.weight": w(i, h),
             "mlp.down_proj.weight": w(h, i)}
    ids = torch.randperm(v)[:vd].sort().values
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[ids] = True
    stored = {**{prefix + k: t for k, t in layer.items()}, "fc.weight": w(h, 3 * h),
              "norm.weight": torch.ones(h), "lm_head.weight": w(vd, h),
              "d2t": ids - torch.arange(vd), "t2d": t2d}
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(conf, indent=2))
    save_file(stored, str(d / "model.safetensors"), metadata={"format": "pt"})
    return stored
