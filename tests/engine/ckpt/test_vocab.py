"""Vocab maps: build from loss-masked counts (JSONL and shard dirs), invariants, lm_head remap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.ckpt.checks import load_drafter, run_checks
from engine.ckpt.drafter_dir import open_checkpoint
from engine.ckpt.vocab import (
    build_vocab,
    check_vocab_map,
    count_tokens,
    coverage,
    load_vocab,
    remap_lm_head,
)
from engine.cli import main
from engine.errors import EngineError
from engine.model.draft import Eagle3Draft
from tests.drafters import random_state, tiny_config, write_drafter
from tests.paths import REPO


def write_jsonl(path: Path, rows: list[tuple[list[int], list[int]]]) -> Path:
    path.write_text("".join(json.dumps({"input_ids": i, "loss_mask": m}) + "\n"
                            for i, m in rows))
    return path


def test_build_counts_only_masked_tokens_with_ties_by_lower_id(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [
        ([5, 5, 5, 9, 9, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0, 0, 0]),  # 1 is never masked in
        ([7, 7, 3, 3, 8], [1, 1, 1, 1, 1]),
    ])
    counts, v = count_tokens(data, vocab_size=12)
    assert counts.tolist() == [0, 0, 0, 2, 0, 3, 0, 2, 1, 2, 0, 0]
    assert v == 12
    d2t, t2d = build_vocab(counts, 3)
    # 5 (3 times), then 3, 7 and 9 tie at 2: the lower ids 3 and 7 win; sorted ascending.
    assert (d2t + torch.arange(3)).tolist() == [3, 5, 7]
    assert coverage(counts, t2d) == pytest.approx(7 / 10)


def test_build_exact_selection() -> None:
    counts = torch.tensor([0, 4, 2, 2, 9, 2, 0, 1])
    d2t, t2d = build_vocab(counts, 4)
    targets = (d2t + torch.arange(4)).tolist()
    assert targets == [1, 2, 3, 4]  # 4 (9), 1 (4), then 2 and 3 beat 5 on the tie
    assert t2d.nonzero().flatten().tolist() == targets
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool and t2d.shape == (8,)
    assert coverage(counts, t2d) == pytest.approx(17 / 20)
    # Fewer distinct tokens than Vd: the lowest unused ids fill up at frequency 0.
    d2t, _ = build_vocab(torch.tensor([0, 0, 5, 0, 0, 3]), 4)
    assert (d2t + torch.arange(4)).tolist() == [0, 1, 2, 5]


def test_invariant_checks() -> None:
    d2t, t2d = build_vocab(torch.arange(20), 6)
    check_vocab_map(d2t, t2d, "v")
    with pytest.raises(EngineError, match="t2d"):
        check_vocab_map(d2t, t2d.roll(1), "v")
    bad = d2t.clone()
    bad[-1] += 100
    with pytest.raises(EngineError, match="outside"):
        check_vocab_map(bad, None, "v", vocab_size=20)
    with pytest.raises(EngineError, match="int64"):
        check_vocab_map(d2t.int(), t2d, "v")


def test_build_from_prepared_shard_directory(tmp_path: Path) -> None:
    d = tmp_path / "data"
    d.mkdir()
    # Packed tensors in one shard, padded per-sample pairs in the other, plus ignored features.
    save_file({"input_ids": torch.tensor([4, 4, 6, 2]), "loss_mask": torch.tensor([1, 1, 1, 0]),
               "aux_hidden_states": torch.zeros(4, 3)}, str(d / "shard_00000.safetensors"))
    save_file({"s0.input_ids": torch.tensor([[6, 6, 0]]),
               "s0.loss_mask": torch.tensor([[1, 1, 0]], dtype=torch.uint8),
               "s1.input_ids": torch.tensor([2]), "s1.loss_mask": torch.tensor([1])},
              str(d / "shard_00001.safetensors"))
    (d / "manifest.json").write_text(json.dumps({"vocab_size": 8, "samples": 3}))
    counts, v = count_tokens(d)
    assert v == 8 and counts.tolist() == [0, 0, 1, 0, 2, 0, 3, 0]
    # The manifest `engine prepare` writes: shard objects, vocab size under `target`.
    (d / "manifest.json").write_text(json.dumps({
        "target": {"vocab_size": 8}, "shards": [{"file": "shard_00001.safetensors", "n": 2}]}))
    counts, v = count_tokens(d)
    assert v == 8 and counts.tolist() == [0, 0, 1, 0, 0, 0, 2, 0]
    (d / "manifest.json").write_text(json.dumps({"vocab_size": 8, "samples": 3}))
    out = tmp_path / "vocab.safetensors"
    assert main(["vocab", "build", "--data", str(d), "--draft-vocab-size", "2",
                 "--out", str(out)]) == 0
    d2t, t2d = load_vocab(out)
    assert (d2t + torch.arange(2)).tolist() == [4, 6]


@pytest.mark.parametrize("line,words", [
    ('{"input_ids": [1, 99], "loss_mask": [1, 1]}', ["d.jsonl:2", "99", "input_ids"]),
    ('{"input_ids": [1, 2], "loss_mask": [1]}', ["d.jsonl:2", "differ"]),
    ('{"input_ids": [1, 2]}', ["d.jsonl:2", "loss_mask"]),
    ("not json", ["d.jsonl:2", "invalid JSON"]),
    ('{"input_ids": [1, 2], "loss_mask": [1, 2]}', ["d.jsonl:2", "0 or 1"]),
])
def test_bad_data_lines(tmp_path: Path, capsys: pytest.CaptureFixture, line: str,
                        words: list[str]) -> None:
    p = tmp_path / "d.jsonl"
    p.write_text('{"input_ids": [1], "loss_mask": [1]}\n' + line + "\n")
    capsys.readouterr()
    rc = main(["vocab", "build", "--data", str(p), "--draft-vocab-size", "4", "--vocab-size",
               "10", "--out", str(tmp_path / "v.safetensors")])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1
    for w in words:
        assert w in err
    assert not (tmp_path / "v.safetensors").exists()


def test_jsonl_needs_a_vocab_size(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    p = write_jsonl(tmp_path / "d.jsonl", [([1], [1])])
    assert main(["vocab", "build", "--data", str(p), "--draft-vocab-size", "1",
                 "--out", str(tmp_path / "v.safetensors")]) == 1
    assert "vocab size" in capsys.readouterr().err
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.json").write_text('{"vocab_size": 16}')
    assert main(["vocab", "build", "--data", str(p), "--draft-vocab-size", "3", "--target",
                 str(tmp_path / "t"), "--out", str(tmp_path / "v.safetensors")]) == 0
    assert load_vocab(tmp_path / "v.safetensors")[1].shape == (16,)


# -- remap -------------------------------------------------------------------------------------


def _logits_by_target_id(d: Path, h: torch.Tensor) -> dict[int, torch.Tensor]:
    cfg, sd, _ = load_drafter(d)
    m = Eagle3Draft(cfg)
    m.load_state_dict(sd, strict=False)  # no embedding stored: it is the target's
    with torch.no_grad():
        logits = m.logits(h)  # [N, Vd]
    ids = m.to_target_ids(torch.arange(cfg.draft_vocab_size))
    return {int(t): logits[:, i] for i, t in enumerate(ids)}


@pytest.mark.parametrize("style", ["eagle", "speculators"])
def test_remap_keeps_kept_token_logits_exactly(tmp_path: Path, style: str) -> None:
    cfg = tiny_config()  # V 512, Vd 128
    write_drafter(tmp_path / "old", cfg=cfg, style=style, seed=3)
    old_targets = set((random_state(cfg, seed=3)["d2t"] + torch.arange(128)).tolist())
    # New vocab: half of the old tokens plus new ones, of a different size.
    counts = torch.zeros(512, dtype=torch.int64)
    kept = sorted(old_targets)[::2]
    counts[kept] = 10
    new = [t for t in range(512) if t not in old_targets][:36]
    counts[new] = 5
    d2t, t2d = build_vocab(counts, 100)
    from engine.ckpt.vocab import save_vocab
    save_vocab(tmp_path / "v.safetensors", d2t, t2d)
    assert main(["vocab", "remap", str(tmp_path / "old"), "--vocab",
                 str(tmp_path / "v.safetensors"), "--out", str(tmp_path / "new")]) == 0
    h = torch.randn(5, cfg.hidden_size)
    before = _logits_by_target_id(tmp_path / "old", h)
    after = _logits_by_target_id(tmp_path / "new", h)
    both = set(before) & set(after)
    assert both == set(kept) and len(after) == 100
    for t in both:
        assert torch.equal(before[t], after[t]), t
    ck = open_checkpoint(tmp_path / "new")
    assert ck.detected.format == style and all(c.ok for c in run_checks(ck))
    assert ck.config.draft_vocab_size == 100
    prov = json.loads((tmp_path / "new" / "provenance.json").read_text())
    assert prov["remap"]["kept"] == 64 and prov["remap"]["new"] == 36
    assert prov["remap"]["new_rows_from"] == "mean of kept rows"


def test_remap_new_rows_come_from_the_target(tmp_path: Path) -> None:
    cfg = tiny_config()
    write_drafter(tmp_path / "old", cfg=cfg, seed=1)
    target_head = torch.randn(512, 64).to(torch.bfloat16)
    (tmp_path / "target").mkdir()
    save_file({"lm_head.weight": target_head, "model.embed_tokens.weight": torch.zeros(512, 64)},
              str(tmp_path / "target" / "model.safetensors"))
    d2t, t2d = build_vocab(torch.arange(512), 128)  # the 128 highest ids
    from engine.ckpt.vocab import save_vocab
    save_vocab(tmp_path / "v.safetensors", d2t, t2d)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "engine", "vocab", "remap", str(tmp_path / "old"),
                        "--vocab", str(tmp_path / "v.safetensors"), "--out", str(tmp_path / "new"),
                        "--target", str(tmp_path / "target"), "--json"],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    _, old_sd, _ = load_drafter(tmp_path / "old")
    _, sd, _ = load_drafter(tmp_path / "new")
    old_t = (old_sd["d2t"] + torch.arange(128)).tolist()
    new_t = (sd["d2t"] + torch.arange(128)).tolist()
    assert new_t == list(range(384, 512))
    for row, t in enumerate(new_t):
        if t in old_t:
            assert torch.equal(sd["lm_head.weight"][row], old_sd["lm_head.weight"][old_t.index(t)])
        else:
            assert torch.equal(sd["lm_head.weight"][row], target_head[t].float())
    assert summary["kept"] == len(set(old_t) & set(new_t))
    assert summary["new"] == 128 - summary["kept"]
    assert torch.equal(sd["t2d"], t2d)


def test_remap_function_mean_fallback() -> None:
    head = torch.arange(12, dtype=torch.float32).reshape(4, 3)  # rows of targets 0, 2, 4, 6
    old_d2t = torch.tensor([0, 1, 2, 3])
    new_d2t = torch.tensor([2, 2, 3])  # targets 2, 3, 5: only 2 was in the old vocab
    out, stats = remap_lm_head(head, old_d2t, new_d2t, 8)
    assert stats == {"kept": 1, "new": 2, "dropped": 3, "old_size": 4, "new_size": 3}
    assert torch.equal(out[0], head[1])  # target 2 was old row 1, moved exactly
    assert torch.equal(out[1], head[1]) and torch.equal(out[2], head[1])  # the kept rows' mean


def test_remap_refuses_a_vocab_for_another_target(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    write_drafter(tmp_path / "old")
    d2t, t2d = build_vocab(torch.arange(300), 50)
    from engine.ckpt.vocab import save_vocab
    save_vocab(tmp_path / "v.safetensors", d2t, t2d)
    assert main(["vocab", "remap", str(tmp_path / "old"), "--vocab",
                 str(tmp_path / "v.safetensors"), "--out", str(tmp_path / "new")]) == 1
    assert "t2d" in capsys.readouterr().err and not (tmp_path / "new").exists()
