"""A tiny random Llama target with the demo tokenizer, conversations in our spelling and in
ShareGPT's, and `prepare` run once over them by the real CLI: module fixtures for the prepare,
data and safety tests. Import the fixtures a test module uses by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.demo.target import build_tokenizer, chats
from tests.engine_helpers import run_engine

CONVS = [
    [{"role": "system", "content": "you are terse."},
     {"role": "user", "content": "count from 3 to 6"},
     {"role": "assistant", "content": "3, 4, 5, 6."},
     {"role": "user", "content": "spell the word river"},
     {"role": "assistant", "content": "r-i-v-e-r."},
     {"role": "user", "content": "my name is bob."},
     {"role": "assistant", "content": "hello bob! nice to meet you.\nhow can i help?"}],
    [{"role": "user", "content": "what color is the sky?"},
     {"role": "assistant", "content": " the sky is blue. "},
     {"role": "user", "content": "assistant"},
     {"role": "assistant", "content": "a"}],
]


@pytest.fixture(scope="module")
def tok() -> Any:
    return build_tokenizer(chats(300, 0))


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory: pytest.TempPathFactory, tok: Any) -> Path:
    """A random-init 7-layer transformers Llama with the demo tokenizer (no quality needed): the
    fewest layers whose default aux ids 2, N//2, N-3 are distinct."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=7, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, tie_word_embeddings=False,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    d = tmp_path_factory.mktemp("tiny") / "target"
    LlamaForCausalLM(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def write_sharegpt(path: Path) -> list[list[dict[str, str]]]:
    """ShareGPT spelling (from/value), no ids; returns the turns in our spelling."""
    role = {"user": "human", "assistant": "gpt", "system": "system"}
    with open(path, "w", encoding="utf-8") as f:
        for turns in CONVS + chats(6, 3):
            f.write(json.dumps({"conversations": [{"from": role[t["role"]], "value": t["content"]}
                                                  for t in turns]}) + "\n")
        f.write(json.dumps({"conversations": [{"from": "human", "value": "no answer"}]}) + "\n")
    return CONVS + chats(6, 3)


@pytest.fixture(scope="module")
def prepared(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[Path, list[list[dict[str, str]]], dict[str, Any]]:
    """`prepare` run once by the CLI on ShareGPT input: (DATA_DIR, conversations, --json output)."""
    d = tmp_path_factory.mktemp("prepared")
    src = d / "conv.jsonl"
    convs = write_sharegpt(src)
    out = d / "data"
    p = run_engine("prepare", "--target", str(tiny_target), "--data", str(src), "--out", str(out),
                   "--max-len", "64", "--batch-tokens", "200", "--json")
    return out, convs, json.loads(p.stdout)
