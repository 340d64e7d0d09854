"""A tiny Kimi-K2.5-shaped target and its unwrapped twin, from the same weights.

The text stack is a DeepSeek-V3 MoE with MLA at Kimi's attention sizes (q_lora 128, kv_lora 512,
rope 64, nope 128, v 128), yarn rope, sigmoid routing (`noaux_tc`) with a non-zero
`e_score_correction_bias` -- tiny otherwise (hidden 64, 7 layers, 4 experts). The wrapper is
stored as Kimi-K2.5 ships: `KimiK25ForConditionalGeneration`, `text_config` of model_type
`kimi_k2`, the text stack under `language_model.model.*` / `language_model.lm_head.*`, and a small
vision tower and projector beside it. The twin is the same text stack as a plain
`DeepseekV3ForCausalLM`. Both carry the demo target's tokenizer.

Use with `pytest_plugins = ("tests.demo_workspace", "tests.kimi_target")`; the pair is built once
per session and is read-only (copy what a test changes).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

LAYERS = 7  # default aux ids 2, 3, 4
EXPERTS = 4
# Kimi-K2's rope: yarn, here scaled to a 512-token window
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
        "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
        "rope_theta": 50000.0}
# the bias decides which 2 of 4 experts a token gets (sigmoid scores of a random router sit near
# 0.5), so a target that ignored it would route differently; spread wide, no near-ties
BIAS = torch.tensor([0.3, 0.1, -0.1, -0.3])


def _copy_tokenizer(src: Path, dst: Path) -> None:
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
              "special_tokens_map.json", "generation_config.json"):
        if (src / f).exists():
            shutil.copy(src / f, dst / f)


def _text_config(vocab: dict) -> dict:
    from transformers import DeepseekV3Config
    cfg = DeepseekV3Config(
        vocab_size=vocab["vocab_size"], hidden_size=64, intermediate_size=128,
        moe_intermediate_size=32, num_hidden_layers=LAYERS, num_attention_heads=2,
        num_key_value_heads=2, n_routed_experts=EXPERTS, n_shared_experts=1,
        num_experts_per_tok=2, first_k_dense_replace=1, n_group=1, topk_group=1,
        routed_scaling_factor=2.827, norm_topk_prob=True, kv_lora_rank=512, q_lora_rank=128,
        qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        max_position_embeddings=512, rope_parameters=dict(YARN), tie_word_embeddings=False,
        pad_token_id=vocab.get("pad_token_id"), eos_token_id=vocab.get("eos_token_id"),
        bos_token_id=None)
    d = cfg.to_dict()
    d.update(topk_method="noaux_tc", scoring_func="sigmoid", architectures=[
        "DeepseekV3ForCausalLM"], dtype="float32")
    return d


def build_kimi_pair(demo_target: Path, out: Path) -> tuple[Path, Path]:
    """(wrapper dir, plain dir) under `out`, the same random text stack in both."""
    from safetensors.torch import load_file, save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    vocab = json.loads((demo_target / "config.json").read_text())
    text = _text_config(vocab)
    torch.manual_seed(29)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**text)).to(torch.float32)
    plain, wrapped = out / "plain", out / "kimi-k25"
    # save_pretrained writes the checkpoint layout (one tensor per expert, as vLLM reads it),
    # not transformers 5's fused in-memory experts
    model.save_pretrained(plain)
    sd = load_file(str(plain / "model.safetensors"))
    for i in range(1, LAYERS):  # written whether or not transformers counts it as a weight
        sd[f"model.layers.{i}.mlp.gate.e_score_correction_bias"] = BIAS.clone()
    for d in (plain, wrapped):
        d.mkdir(parents=True, exist_ok=True)
        _copy_tokenizer(demo_target, d)
    save_file(sd, str(plain / "model.safetensors"), metadata={"format": "pt"})
    (plain / "config.json").write_text(json.dumps(text, indent=2))
    g = torch.Generator().manual_seed(7)
    vision = {  # a vision tower and projector beside the text stack: never loaded
        "vision_tower.patch_embed.proj.weight": torch.randn(32, 3, 14, 14, generator=g),
        "vision_tower.encoder.blocks.0.wqkv.weight": torch.randn(96, 32, generator=g),
        "vision_tower.encoder.final_layernorm.weight": torch.ones(32),
        "mm_projector.proj.0.weight": torch.randn(128, 128, generator=g),
        "mm_projector.proj.2.weight": torch.randn(64, 128, generator=g),
    }
    wsd = {"language_model." + k: v for k, v in sd.items()} | vision
    save_file(wsd, str(wrapped / "model.safetensors"), metadata={"format": "pt"})
    kimi_text = {**text, "model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"]}
    wcfg = {
        "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "text_config": kimi_text,
        "vision_config": {"model_type": "kimi_k25_vision", "patch_size": 14,
                          "pos_emb_height": 8, "pos_emb_width": 8, "pos_emb_time": 4,
                          "num_attention_heads": 2, "num_hidden_layers": 1,
                          "hidden_size": 32, "intermediate_size": 64,
                          "merge_kernel_size": [2, 2]},
        "projection_hidden_size": 128, "image_token_id": vocab["vocab_size"] - 1,
        "tie_word_embeddings": False, "dtype": "float32",
    }
    (wrapped / "config.json").write_text(json.dumps(wcfg, indent=2))
    return wrapped, plain


@pytest.fixture(scope="session")
def kimi_pair(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(Kimi-K2.5-shaped wrapper, its unwrapped DeepSeek-V3 twin): read-only."""
    return build_kimi_pair(demo_dir / "target", tmp_path_factory.mktemp("kimi"))
