"""MLA drafter checkpoints: the config style that can express them (flat,
vLLM's Eagle3DeepseekV2ForCausalLM), the ones refused by name, the key layouts (TorchSpec's
`midlayer.*`, `layers.0.*`), `inspect`'s shape checks per field, `convert`, and a finetune on the
demo target that exports what it read."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.ckpt.config_styles import MLA_ARCH, config_from_dict, to_eagle_dict, to_speculators_dict
from engine.errors import EngineError
from engine.model.presets import preset
from tests.drafters import MLA_ATTENTION_NAMES, mla_config_dict, write_mla_drafter
from tests.engine_helpers import run_engine
from tests.paths import REPO
from tests.vllm_real import vllm_env

pytest_plugins = ("tests.demo_workspace", "tests.vllm_real")


def test_a_torchspec_config_reads_and_writes_back_as_vllm_reads_it() -> None:
    conf = mla_config_dict()
    cfg = config_from_dict(conf)
    assert cfg.layer_kind == "mla" and cfg.head_dim == 8 and cfg.num_key_value_heads == 4
    assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.v_head_dim) == \
        (24, 16, 12, 10)
    out = to_eagle_dict(cfg)
    assert out["architectures"] == [MLA_ARCH] and out["model_type"] == "deepseek_v2"
    assert "head_dim" not in out and out["rope_interleave"] is True
    for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
              "v_head_dim", "draft_vocab_size", "vocab_size"):
        assert out[k] == conf[k], k
    assert out["rope_scaling"]["original_max_position_embeddings"] == 512
    assert config_from_dict(out) == cfg
    # no original context in the config: the export names the one our yarn used
    rs = {k: v for k, v in conf["rope_scaling"].items()  # type: ignore[attr-defined]
          if k != "original_max_position_embeddings"}
    short = to_eagle_dict(config_from_dict({**conf, "rope_scaling": rs}))
    assert short["rope_scaling"]["original_max_position_embeddings"] == 2048


def test_presets_build() -> None:
    big = preset("kimi-k2-mla")
    assert (big.hidden_size, big.num_attention_heads, big.q_lora_rank, big.kv_lora_rank,
            big.qk_rope_head_dim, big.qk_nope_head_dim, big.v_head_dim) == \
        (7168, 64, 1536, 512, 64, 128, 128)
    assert preset("tiny-mla").layer_kind == "mla" and preset("tiny").layer_kind == "llama"


@pytest.mark.parametrize(("change", "field"), [
    ({"kv_lora_rank": None}, "kv_lora_rank"),  # an MLA architecture without its sizes
    ({"rope_interleave": False}, "rope_interleave"),
    ({"v_head_dim": 0}, "v_head_dim"),
    ({"head_dim": 16}, "head_dim"),
    ({"num_key_value_heads": 2}, "num_key_value_heads"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling.rope_type"),
])
def test_bad_mla_configs_are_refused_naming_the_field(change: dict[str, object],
                                                      field: str) -> None:
    with pytest.raises(EngineError, match=f"config field '{field}'"):
        config_from_dict({**mla_config_dict(), **change})


@pytest.mark.parametrize(("key", "value", "says"), [
    ("mscale", "nan", "'nan' must be a number from 0 to 100"),
    ("mscale_all_dim", -1.0, "-1.0 must be a number from 0 to 100"),
    ("original_max_position_embeddings", -1, "-1 must be an integer from 1 to"),
    ("original_max_position_embeddings", 512.5, "512.5 must be an integer from 1 to"),
    ("factor", 1e308, "1e+308 must be a number from 0.001 to 10000"),
    ("factor", True, "True must be a number"),
    ("beta_fast", [32], "[32] must be a number"),
    ("beta_slow", "1", "'1' must be a number"),
])
def test_each_rope_scaling_field_is_checked_by_name(key: str, value: object, says: str) -> None:
    conf = mla_config_dict()
    conf["rope_scaling"] = {**conf["rope_scaling"], key: value}  # type: ignore[dict-item]
    with pytest.raises(EngineError, match=re.escape(f"config field 'rope_scaling.{key}': {says}")):
        config_from_dict(conf)


def test_inspect_and_convert_refuse_a_nan_mscale_naming_the_file(tmp_path: Path) -> None:
    """Before, both passed it and building the model then failed in the RoPE tables."""
    conf = mla_config_dict()
    conf["rope_scaling"] = {**conf["rope_scaling"], "mscale": "nan"}  # type: ignore[dict-item]
    write_mla_drafter(tmp_path / "d", conf)
    for args in (["inspect", "--json"], ["convert", str(tmp_path / "out"), "--to", "vllm"]):
        r = run_engine(args[0], str(tmp_path / "d"), *args[1:], check=False, timeout=120)
        assert r.returncode == 1 and r.stdout == "", (args, r.stdout, r.stderr)
        assert r.stderr == (f"error: {tmp_path / 'd' / 'config.json'}: config field "
                            "'rope_scaling.mscale': 'nan' must be a number from 0 to 100\n")
    assert not (tmp_path / "out").exists()


def test_mla_fields_without_kv_lora_rank_are_refused() -> None:
    with pytest.raises(EngineError, match="'qk_nope_head_dim': set without kv_lora_rank"):
        preset("tiny").with_(qk_nope_head_dim=8)


def test_styles_that_cannot_express_mla_are_refused_by_name() -> None:
    cfg = preset("tiny-mla")
    with pytest.raises(EngineError, match="speculators: an MLA drafter"):
        to_speculators_dict(cfg, verifier="x")


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("mla") / "torchspec"
    write_mla_drafter(d)
    return d


def _failing(d: Path) -> list[str]:
    p = run_engine("inspect", str(d), "--json", check=False)
    rep = json.loads(p.stdout)
    assert (p.returncode == 0) == rep["ok"]
    return [c["name"] for c in rep["checks"] if not c["ok"]]


def test_inspect_and_convert_to_vllm_keep_every_tensor(src: Path, tmp_path: Path) -> None:
    """TorchSpec's config as written would not serve in vLLM 0.32 (model_type deepseek_v3 turns
    into vLLM's MTP model): inspect fails that check alone, naming the fix; the --to vllm export
    keeps every tensor byte for byte and passes."""
    p = run_engine("inspect", str(src), "--json", check=False)
    rep = json.loads(p.stdout)
    assert p.returncode == 1 and rep["config"]["kv_lora_rank"] == 16
    bad = [c for c in rep["checks"] if not c["ok"]]
    assert [c["name"] for c in bad] == ["vllm_mla_config"]
    assert "model_type deepseek_v3" in bad[0]["detail"] and "convert --to vllm" in bad[0]["detail"]
    names = set(rep["tensors"])
    assert {f"midlayer.self_attn.{n}" for n in MLA_ATTENTION_NAMES} <= names
    run_engine("convert", str(src), str(tmp_path / "vllm"), "--to", "vllm")
    a, b = load_file(str(src / "model.safetensors")), load_file(
        str(tmp_path / "vllm" / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    conf = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert conf["architectures"] == [MLA_ARCH] and conf["kv_lora_rank"] == 16
    assert _failing(tmp_path / "vllm") == []


def test_layers0_names_convert_to_midlayer(src: Path, tmp_path: Path) -> None:
    d = tmp_path / "layers0"
    stored = write_mla_drafter(d, prefix="layers.0.")
    # no SGLang names check: an MLA drafter is vLLM's alone (and vLLM renames midlayer.)
    assert _failing(d) == ["vllm_mla_config"]
    run_engine("convert", str(d), str(tmp_path / "out"), "--to", "vllm")
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(out) == {k.replace("layers.0.", "midlayer.") for k in stored}


@pytest.mark.parametrize(("to", "why"), [("speculators", "speculators: an MLA drafter"),
                                         ("sglang", "sglang: an MLA drafter")])
def test_convert_refuses_styles_without_mla(src: Path, tmp_path: Path, to: str, why: str) -> None:
    p = run_engine("convert", str(src), str(tmp_path / to), "--to", to, "--verifier", "x",
                   check=False)
    assert p.returncode != 0 and why in p.stderr and not (tmp_path / to).exists()


def test_inspect_names_a_wrong_mla_shape_and_its_fields(src: Path, tmp_path: Path) -> None:
    d = tmp_path / "bad"
    d.mkdir()
    sd = load_file(str(src / "model.safetensors"))
    sd["midlayer.self_attn.kv_b_proj.weight"] = torch.zeros(4 * 20, 16)  # nope+rope, not nope+v
    save_file(sd, str(d / "model.safetensors"))
    (d / "config.json").write_text((src / "config.json").read_text())
    rep = json.loads(run_engine("inspect", str(d), "--json", check=False).stdout)
    shapes = next(c for c in rep["checks"] if c["name"] == "shapes")
    assert not shapes["ok"]
    assert "kv_b_proj.weight: shape [80, 16] but config says [88, 16] = " \
        "[num_attention_heads*(qk_nope_head_dim+v_head_dim), kv_lora_rank]" in shapes["detail"]


@pytest.mark.slow
def test_finetune_from_an_mla_drafter_trains_exports_and_evaluates(src: Path, demo_dir: Path,
                                                                    tmp_path: Path) -> None:
    """`train --finetune-from` a TorchSpec-layout MLA drafter on the demo target (its config as
    TorchSpec writes it: read although vLLM would not serve it as is): TTT steps run, the export
    keeps the layer kind, sizes, names and vocab, inspect passes, eval runs."""
    run = tmp_path / "run"
    ans = json.loads(run_engine(
        "train", "--target", str(demo_dir / "target"), "--data", str(demo_dir / "data"),
        "--out", str(run), "--finetune-from", str(src), "--max-steps", "3", "--holdout", "0",
        "--device", "cpu", "--json", timeout=600).stdout)
    final = Path(ans["final"])
    assert _failing(final) == []  # the export serves as written
    before, after = load_file(str(src / "model.safetensors")), load_file(
        str(final / "model.safetensors"))
    assert before.keys() == after.keys()  # midlayer.* MLA names in, the same out
    assert torch.equal(before["d2t"], after["d2t"])
    assert not torch.equal(before["midlayer.self_attn.kv_b_proj.weight"],
                           after["midlayer.self_attn.kv_b_proj.weight"])  # it trained
    conf = json.loads((final / "config.json").read_text())
    want = mla_config_dict()
    assert conf["architectures"] == [MLA_ARCH]
    assert all(conf[k] == want[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                            "qk_rope_head_dim", "v_head_dim"))
    ev = json.loads(run_engine("eval", "--draft", str(final), "--target",
                               str(demo_dir / "target"), "--data", str(demo_dir / "data"),
                               "--max-samples", "4", "--max-new-tokens", "8", "--device", "cpu",
                               "--json", timeout=600).stdout)
    assert ev["acceptance_length"] >= 1.0, ev


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("q_lora", [True, False])
def test_vllms_own_loader_takes_every_tensor_of_our_export(vllm_python: str, demo_dir: Path,
                                                           tmp_path: Path, q_lora: bool) -> None:
    """vLLM 0.32's Eagle3DeepseekV2ForCausalLM, built from our exported config.json through
    EngineArgs (`vllm serve --speculative-config`'s path), runs its load_weights over our
    export: every parameter but the shared embedding is written, the fused ones hold the
    tensors they fuse, an extra tensor would raise, and the config fields arrive. Without
    q_lora_rank vLLM's loader fails (it fuses kv_a_proj_with_mqa into a parameter it does not
    build), which is why `convert --to vllm` refuses such a drafter."""
    conf = mla_config_dict() if q_lora else {**mla_config_dict(), "q_lora_rank": None}
    write_mla_drafter(tmp_path / "src", conf)
    to = "vllm" if q_lora else "eagle"  # the same layout; --to vllm refuses the second
    refused = run_engine("convert", str(tmp_path / "src"), str(tmp_path / "x"), "--to", "vllm",
                         check=False)
    assert (refused.returncode != 0) != q_lora
    run_engine("convert", str(tmp_path / "src"), str(tmp_path / "out"), "--to", to)
    p = subprocess.run([vllm_python, "tests/vllm_mla_loader.py", str(tmp_path / "out"),
                        str(demo_dir / "target")], cwd=REPO, env=vllm_env(),
                       capture_output=True, text=True, timeout=500)
    if not q_lora:
        assert p.returncode != 0 and "no module or parameter named 'layers.0.self_attn." \
            "fused_qkv_a_proj'" in p.stdout + p.stderr, p.stderr[-2000:]
        assert "without q_lora_rank" in refused.stderr
        return
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["architecture"] == MLA_ARCH and r["model_type"] == "deepseek_v2"
    assert r["unset"] == ["model.embed_tokens.weight"]  # the target's, shared
    assert r["unknown_raises"] and r["d2t_equal"]
    assert all(r["fused_equal"].values()) and len(r["fused_equal"]) == 2
    assert r["fields"] == {k: conf[k] for k in r["fields"]}
    assert r["rope_type"] == "deepseek_yarn"
