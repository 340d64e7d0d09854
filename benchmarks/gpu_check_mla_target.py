"""gpu_check's MLA target: a random DeepSeek-V3 (MLA + MoE) model with the demo's tokenizer, the
target of the mla-capture, mla-serve-eagle3 and mla-drafter-serve checks (its own module, so the
checks import it without importing one another)."""

from __future__ import annotations

from typing import Any

MLA_CONFIG = {
    "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
    "num_hidden_layers": 7, "num_attention_heads": 4, "num_key_value_heads": 4,
    "q_lora_rank": 64, "kv_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32,
    "v_head_dim": 32, "n_routed_experts": 4, "num_experts_per_tok": 4, "n_shared_experts": 1,
    "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "norm_topk_prob": True,
    "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
}


def build_mla_target(path: str, n_chats: int, seed: int = 0, config: Any = MLA_CONFIG) -> list:
    """A random DeepseekV3 (MLA + MoE) target with the demo's tokenizer at `path` (bf16
    weights; MLA_CONFIG's sizes unless `config`); returns demo conversations for it."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from engine.data.conversations import Conversation
    from engine.demo.target import build_tokenizer, chats

    corpus = chats(n_chats, seed)
    tok = build_tokenizer(corpus)
    cfg = DeepseekV3Config(vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                           eos_token_id=tok.eos_token_id, bos_token_id=None, **config)
    for key in ("kv_lora_rank", "q_lora_rank", "first_k_dense_replace", "n_routed_experts"):
        if getattr(cfg, key, None) != config[key]:
            raise RuntimeError(f"DeepseekV3Config ignored {key}={config[key]}")
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return [Conversation(id=f"c{i:04d}", turns=c) for i, c in enumerate(corpus)]
