"""A Kimi-K2.5-shaped target behind its multimodal wrapper: every command that reads
the target gives what it gives on the unwrapped twin (tests/kimi_target.py, same weights).

The transformers path loads the text stack alone (AutoModelForCausalLM refuses the wrapper's
config); the heads, the final norm and the config checks read `language_model.*` and
`text_config`, never the vision tower."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from engine.ckpt.final_norm import load_final_norm
from engine.ckpt.target_config import read_config
from engine.ckpt.target_layout import resolve_layout
from engine.ckpt.target_weights import load_embedding, target_lm_head_rows
from engine.data.readers import open_data
from engine.data.target import Target
from tests.engine_helpers import run_engine

pytest_plugins = ("tests.demo_workspace", "tests.kimi_target")
pytestmark = [pytest.mark.slow]


def answer(*args: str) -> dict[str, Any]:
    return dict(json.loads(run_engine(*args, "--json", timeout=600).stdout))


def same_data(a: Path, b: Path) -> None:
    da, db = open_data(str(a)), open_data(str(b))
    assert len(da) == len(db) > 0
    for i in range(len(da)):
        x, y = da[i], db[i]
        assert torch.equal(x.input_ids, y.input_ids) and torch.equal(x.loss_mask, y.loss_mask)
        assert torch.equal(x.aux, y.aux) and torch.equal(x.hidden, y.hidden)


def same_weights(a: Path, b: Path) -> None:
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


@pytest.fixture(scope="module")
def runs(kimi_pair: tuple[Path, Path], demo_dir: Path,
         tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """prepare, train --finetune-from, eval, convert, inspect on each of the pair."""
    tmp = tmp_path_factory.mktemp("wrapper-runs")
    conv = tmp / "conv.jsonl"
    conv.write_text("".join((demo_dir / "conversations" / "eval.jsonl").read_text()
                            .splitlines(keepends=True)[:16]))
    wrapped, plain = kimi_pair
    # a drafter for this target to finetune from: a few scratch steps on the twin's data
    answer("prepare", "--target", str(plain), "--data", str(conv), "--out", str(tmp / "d0"),
           "--max-len", "128")
    start = answer("train", "--target", str(plain), "--data", str(tmp / "d0"), "--out",
                   str(tmp / "scratch"), "--max-steps", "2", "--holdout", "0",
                   "--device", "cpu")["final"]
    out: dict[str, dict[str, Any]] = {}
    for name, target in (("wrapped", wrapped), ("plain", plain)):
        d = tmp / name
        r: dict[str, Any] = {"dir": d}
        r["prepare"] = answer("prepare", "--target", str(target), "--data", str(conv),
                              "--out", str(d / "data"), "--max-len", "128")
        r["train"] = answer("train", "--target", str(target), "--data", str(d / "data"),
                            "--out", str(d / "run"), "--finetune-from", start,
                            "--max-steps", "3", "--holdout", "0", "--device", "cpu")
        r["eval"] = answer("eval", "--draft", r["train"]["final"], "--target", str(target),
                           "--data", str(d / "data"), "--max-samples", "4",
                           "--max-new-tokens", "8", "--device", "cpu")
        r["convert"] = answer("convert", r["train"]["final"], str(d / "spec"), "--to",
                              "speculators", "--verifier", str(target), "--embed-from",
                              str(target))
        r["inspect"] = answer("inspect", str(d / "spec"))
        out[name] = r
    return out


def test_the_layout_names_the_text_stack(kimi_pair: tuple[Path, Path]) -> None:
    wrapped, plain = kimi_pair
    lw, lp = resolve_layout(str(wrapped)), resolve_layout(str(plain))
    assert lw.wrapper == "KimiK25ForConditionalGeneration" and lp.wrapper is None
    assert (lw.decoder, lw.head) == ("language_model.model.", "language_model.lm_head.")
    assert lw.text_config["model_type"] == "deepseek_v3"  # kimi_k2 is DeepSeek-V3
    assert lw.to_text("vision_tower.patch_embed.proj.weight") is None
    for key in ("hidden_size", "num_hidden_layers", "vocab_size", "kv_lora_rank"):
        assert read_config(str(wrapped))[key] == read_config(str(plain))[key]


def test_heads_and_final_norm_come_from_the_language_model(kimi_pair: tuple[Path, Path]
                                                           ) -> None:
    wrapped, plain = kimi_pair
    (ew, hw), (ep, hp) = load_embedding(str(wrapped)), load_embedding(str(plain))
    assert torch.equal(ew, ep) and torch.equal(hw.full(), hp.full())
    rows = torch.tensor([0, 5, 17])
    assert torch.equal(target_lm_head_rows(wrapped, rows)[0], target_lm_head_rows(plain, rows)[0])
    cfg = read_config(str(wrapped))
    nw, np_ = load_final_norm(str(wrapped), cfg), load_final_norm(str(plain), cfg)
    assert torch.equal(nw.weight, np_.weight) and nw.eps == np_.eps


def test_the_transformers_target_is_the_text_stack_alone(kimi_pair: tuple[Path, Path]) -> None:
    wrapped, plain = kimi_pair
    a = Target.load(str(wrapped), device="cpu", tokenizer=False)
    b = Target.load(str(plain), device="cpu", tokenizer=False)
    assert type(a.model).__name__ == "DeepseekV3ForCausalLM"
    assert not any("vision" in n or "mm_projector" in n for n, _ in a.model.named_parameters())
    bias = a.model.model.layers[1].mlp.gate.e_score_correction_bias
    assert bias.abs().sum() > 0  # the router's correction bias was read, not left at zero
    ids = torch.randint(0, a.model.config.vocab_size, (2, 200), generator=torch.Generator()
                        .manual_seed(0))
    for x, y in zip(a.features(ids), b.features(ids), strict=True):
        assert torch.equal(x, y)


def test_every_command_gives_the_twins_result(runs: dict[str, dict[str, Any]]) -> None:
    w, p = runs["wrapped"], runs["plain"]
    same_data(w["dir"] / "data", p["dir"] / "data")
    assert w["prepare"]["aux_layer_ids"] == p["prepare"]["aux_layer_ids"] == [2, 3, 4]
    same_weights(Path(w["train"]["final"]), Path(p["train"]["final"]))
    assert w["eval"]["acceptance_length"] == p["eval"]["acceptance_length"]
    same_weights(w["dir"] / "spec", p["dir"] / "spec")
    arch = json.loads((w["dir"] / "spec" / "config.json").read_text())
    assert arch["speculators_config"]["verifier"]["architectures"] == [
        "KimiK25ForConditionalGeneration"]  # what vLLM serves the drafter behind
    assert w["inspect"]["config"]["target_hidden_size"] == p["inspect"]["config"][
        "target_hidden_size"] == 64
