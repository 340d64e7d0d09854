"""One rule for a target's embedding and lm_head (engine/ckpt/key_map.py's target_heads), as train,
convert --embed-from and vocab remap read them (engine/ckpt/target_weights.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.ckpt.key_map import target_heads
from engine.ckpt.target_weights import load_embedding, target_lm_head_rows
from engine.errors import EngineError


def test_known_names_first_then_a_wrapper_suffix_outside_the_layers() -> None:
    names = ["model.layers.3.embed_tokens.weight", "model.embed_tokens.weight", "lm_head.weight"]
    assert target_heads(names, False, "t") == ("model.embed_tokens.weight", "lm_head.weight")
    wrapped = ["mtp.embed_tokens.weight", "thinker.model.embed_tokens.weight",
               "thinker.lm_head.weight", "model.layers.0.mlp.weight"]
    assert target_heads(wrapped, False, "t") == ("thinker.model.embed_tokens.weight",
                                                 "thinker.lm_head.weight")


def test_a_tied_target_uses_its_embedding_and_an_untied_one_must_have_a_head() -> None:
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    assert target_heads(names, True, "t") == ("model.embed_tokens.weight",) * 2
    assert target_heads(names, None, "t") == ("model.embed_tokens.weight",) * 2  # no config
    with pytest.raises(EngineError, match="t: no 'lm_head.weight' tensor and tie_word_embeddings"):
        target_heads(names, False, "t")
    assert target_heads(names, False, "t", need_head=False)[0] == "model.embed_tokens.weight"
    with pytest.raises(EngineError, match="t: no embedding tensor"):
        target_heads(["lm_head.weight"], True, "t")


def _target(d: Path, tensors: dict[str, torch.Tensor], config: dict[str, object] | None) -> Path:
    d.mkdir()
    save_file(tensors, str(d / "model.safetensors"))
    if config is not None:
        (d / "config.json").write_text(json.dumps(config))
    return d


def test_heads_tied_and_untied(tmp_path: Path) -> None:
    emb, head = torch.randn(16, 4), torch.randn(16, 4)
    cfg = {"hidden_size": 4, "num_hidden_layers": 2, "vocab_size": 16}
    tied = _target(tmp_path / "tied", {"model.embed_tokens.weight": emb},
                   {**cfg, "tie_word_embeddings": True})
    e, th = load_embedding(str(tied))
    h = th.full()
    assert torch.equal(e, emb) and h is e
    untied = _target(tmp_path / "untied", {"model.embed_tokens.weight": emb,
                                           "lm_head.weight": head}, cfg)
    e, th = load_embedding(str(untied))
    h = th.full()
    assert torch.equal(e, emb) and torch.equal(h, head)
    broken = _target(tmp_path / "broken", {"model.embed_tokens.weight": emb}, cfg)
    with pytest.raises(EngineError, match="broken: no 'lm_head.weight' tensor"):
        load_embedding(str(broken))


def test_target_head_reads_rows_alone_and_the_whole_only_when_asked(tmp_path: Path) -> None:
    """The trainer's view of the lm_head: draft rows read from the file (the bf16 storage
    upcast), the whole matrix on demand; a tied target's head is its embedding."""
    emb, head = torch.randn(16, 4), torch.randn(16, 4).bfloat16()
    cfg = {"hidden_size": 4, "num_hidden_layers": 2, "vocab_size": 16}
    untied = _target(tmp_path / "untied", {"model.embed_tokens.weight": emb,
                                           "lm_head.weight": head}, cfg)
    e, th = load_embedding(str(untied))
    ids = torch.tensor([9, 0, 15, 9])
    assert torch.equal(e, emb) and torch.equal(th.rows(ids), head.float()[ids])
    with pytest.raises(EngineError, match="'lm_head.weight' has 16 rows, the vocab needs id 16"):
        th.rows(torch.tensor([3, 16]))  # never a read past the tensor's bytes
    (untied / "model.safetensors").unlink()  # rows came from the file; nothing was kept
    with pytest.raises(EngineError, match="no weights"):
        th.full()
    save_file({"model.embed_tokens.weight": emb, "lm_head.weight": head},
              str(untied / "model.safetensors"))
    assert torch.equal(th.full(), head.float()) and th.full() is th.full()
    tied = _target(tmp_path / "tied", {"model.embed_tokens.weight": emb},
                   {**cfg, "tie_word_embeddings": True})
    e, th = load_embedding(str(tied))
    assert th.full() is e and torch.equal(th.rows(ids), emb[ids])


def test_lm_head_rows_of_a_weights_only_target_fall_back_to_the_embedding(tmp_path: Path) -> None:
    emb = torch.randn(16, 4)
    t = _target(tmp_path / "t", {"model.embed_tokens.weight": emb}, None)
    rows, where = target_lm_head_rows(t, torch.tensor([5, 2]), 4)
    assert torch.equal(rows, emb[[5, 2]]) and where == "model.safetensors:model.embed_tokens.weight"
