"""`python -m engine inspect`: format, tensor table, config summary, checks and exit status."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.ckpt.config_styles import to_eagle_dict
from engine.cli import main
from tests.drafters import random_state, tiny_config, write_drafter
from tests.paths import REPO


def inspect_json(path: Path, capsys: pytest.CaptureFixture) -> tuple[int, dict]:
    capsys.readouterr()
    rc = main(["inspect", str(path), "--json"])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("to", ["eagle", "speculators", "vllm", "sglang"])
def test_converted_checkpoints_pass_every_check(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                to: str) -> None:
    write_drafter(tmp_path / "src", style="speculators", layout="sharded", embed=True)
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "out"), "--to", to]) == 0
    rc, r = inspect_json(tmp_path / "out", capsys)
    assert rc == 0 and r["ok"]
    assert r["format"] == ("speculators" if to == "speculators" else "eagle")
    assert r["style"] == to  # a vllm or sglang export is named so, not "eagle"
    assert {c["name"] for c in r["checks"]} >= {"unknown_keys", "required", "shapes",
                                                 "vocab_map", "embedding"}
    assert all(c["ok"] for c in r["checks"])
    layer = "layers.0." if to == "speculators" else "midlayer."
    assert r["tensors"][layer + "self_attn.q_proj.weight"] == {
        "shape": [64, 128], "dtype": "F32", "bytes": 64 * 128 * 4, "file": "model.safetensors"}
    c = r["config"]
    assert (c["hidden_size"], c["target_hidden_size"], c["intermediate_size"]) == (64, 64, 128)
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]) == (4, 2, 16)
    assert (c["vocab_size"], c["draft_vocab_size"]) == (512, 128)
    assert c["aux_layer_ids"] == [2, 4, 5]


def test_human_output(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_drafter(tmp_path, style="eagle")
    capsys.readouterr()
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "eagle format" in out
    assert "midlayer.self_attn.k_proj.weight" in out and "32x128" in out and "F32" in out
    assert "H 64  Ht 64  I 128  heads 4/2  head_dim 16  V 512  Vd 128" in out
    assert "PASS  vocab_map" in out and "FAIL" not in out


def _bad_t2d(d: Path) -> None:
    s = random_state(tiny_config())
    s["t2d"][:] = False
    write_drafter(d, state=s)


def _bad_shape(d: Path) -> None:
    import torch
    s = random_state(tiny_config())
    s["lm_head.weight"] = torch.zeros(100, 64)
    write_drafter(d, state=s)


def _unknown(d: Path) -> None:
    import torch
    s = random_state(tiny_config())
    s["midlayer.self_attn.rotary_emb.inv_freq"] = torch.zeros(8)  # ignored, not unknown
    s["midlayer.mystery.weight"] = torch.zeros(8)
    write_drafter(d, state=s)


def _no_nbr(d: Path) -> None:
    write_drafter(d, style="speculators")
    conf = json.loads((d / "config.json").read_text())
    del conf["norm_before_residual"]
    (d / "config.json").write_text(json.dumps(conf))


def _mixed(d: Path) -> None:
    write_drafter(d, style="speculators")
    (d / "config.json").write_text(json.dumps(to_eagle_dict(tiny_config())))


@pytest.mark.parametrize("damage,check", [(_bad_t2d, "vocab_map"), (_bad_shape, "shapes"),
                                          (_unknown, "unknown_keys"),
                                          (_no_nbr, "norm_before_residual"),
                                          (_mixed, "serving_names")])
def test_failing_check_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture,
                               damage: Callable[[Path], None], check: str) -> None:
    damage(tmp_path)
    rc, r = inspect_json(tmp_path, capsys)
    assert rc == 1 and r["ok"] is False
    failed = [c["name"] for c in r["checks"] if not c["ok"]]
    assert failed == [check], r["checks"]


def test_embedding_present_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_drafter(tmp_path, embed=True)
    rc, r = inspect_json(tmp_path, capsys)
    emb = next(c for c in r["checks"] if c["name"] == "embedding")
    assert rc == 0 and emb["detail"].startswith("present [512, 64]")


def test_a_config_field_of_the_wrong_type_is_one_line_naming_file_and_field(tmp_path: Path
                                                                          ) -> None:
    write_drafter(tmp_path, style="speculators")
    conf = json.loads((tmp_path / "config.json").read_text())
    conf["speculators_config"]["proposal_methods"] = 3
    (tmp_path / "config.json").write_text(json.dumps(conf))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "engine", "inspect", str(tmp_path)],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1, r.stderr
    assert f"{tmp_path / 'config.json'}: config field 'speculators_config.proposal_methods'" \
        in r.stderr


def test_unreadable_checkpoint_is_one_line_error(tmp_path: Path) -> None:
    write_drafter(tmp_path, layout="bin")
    (tmp_path / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not really a zip")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "engine", "inspect", str(tmp_path), "--json"],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "pytorch_model.bin" in r.stderr
