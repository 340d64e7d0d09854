"""Named drafter sizes (gpt-fast style presets): "tiny" and "tiny-mla" run on CPU in
milliseconds (tests); the others match the public drafters' shapes.

    PRESETS: name -> Eagle3Config     preset(name) -> a fresh copy (EngineError: unknown name)
"""

from __future__ import annotations

import copy

from engine.errors import EngineError
from engine.model.config import Eagle3Config

__all__ = ["PRESETS", "preset"]

# Named sizes. "tiny" runs on CPU in milliseconds; the others match public drafters' shapes.
PRESETS: dict[str, Eagle3Config] = {
    "tiny": Eagle3Config(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=512, draft_vocab_size=128,
                         rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=512,
                         target_num_layers=8, torch_dtype="float32"),
    "llama3-8b": Eagle3Config(
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, vocab_size=128256, draft_vocab_size=32000, rms_norm_eps=1e-5,
        rope_theta=500000.0, max_position_embeddings=131072, target_num_layers=32,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        verifier="meta-llama/Llama-3.1-8B-Instruct", verifier_architectures=["LlamaForCausalLM"]),
    # DeepSeek-V3-style drafter for a Kimi-K2 target (hidden 7168, V 163840, 61 layers).
    "kimi-k2": Eagle3Config(
        hidden_size=7168, intermediate_size=40960, num_attention_heads=56, num_key_value_heads=8,
        head_dim=128, vocab_size=163840, draft_vocab_size=32000, rms_norm_eps=1e-6,
        rope_theta=50000.0, max_position_embeddings=131072, target_num_layers=61,
        verifier="moonshotai/Kimi-K2-Instruct",
        verifier_architectures=["DeepseekV3ForCausalLM"]),
    # The MLA drafter of TorchSpec's public Kimi-K2.5 drafters: Kimi-K2's attention
    # sizes (64 heads, q_lora 1536, kv_lora 512, nope 128 / rope 64 / v 128, yarn x32), a dense MLP
    # at its dense layers' width.
    "kimi-k2-mla": Eagle3Config(
        hidden_size=7168, intermediate_size=18432, num_attention_heads=64, vocab_size=163840,
        draft_vocab_size=32000, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, rms_norm_eps=1e-6, rope_theta=50000.0,
        rope_scaling={"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                      "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
        max_position_embeddings=131072, target_num_layers=61,
        verifier="moonshotai/Kimi-K2-Instruct", verifier_architectures=["DeepseekV3ForCausalLM"]),
    # A CPU-sized MLA drafter for tests (yarn with mscale, q_lora on).
    "tiny-mla": Eagle3Config(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, vocab_size=512,
        draft_vocab_size=128, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=12,
        qk_rope_head_dim=8, v_head_dim=10, rms_norm_eps=1e-6, rope_theta=10000.0,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                      "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.7},
        max_position_embeddings=512, target_num_layers=8, torch_dtype="float32"),
}


def preset(name: str) -> Eagle3Config:
    """A fresh copy of a named preset."""
    if name not in PRESETS:
        raise EngineError(f"unknown preset {name!r} (one of {', '.join(PRESETS)})")
    return copy.deepcopy(PRESETS[name])
