"""`train --data DIR` reads a speculators offline directory: Arrow rows + hidden_states/hs_<i>."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.data.chat import tokenize_conversation
from engine.data.readers import open_data
from engine.errors import EngineError
from tests.engine_helpers import run_engine
from tests.tiny_llama import write_sharegpt

pytest_plugins = ("tests.tiny_llama",)

pa = pytest.importorskip("pyarrow", reason="speculators directories are Arrow datasets")

LAYERS = 8  # vLLM ids [2, 4, 5, 8]: speculators refuses repeated ids, so N//2 != N-3
MAX_LEN = 64


@pytest.fixture(scope="module")
def target8(tmp_path_factory: pytest.TempPathFactory, tok: Any) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, tie_word_embeddings=False, rms_norm_eps=1e-5,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    d = tmp_path_factory.mktemp("t8") / "target"
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # a final norm that is not all ones, so forgetting it shows
        model.model.norm.weight.uniform_(0.5, 1.5)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def write_speculators_dir(target: Path, convs: list[list[dict[str, str]]], tok: Any,
                          dst: Path) -> None:
    """The layout speculators' prepare_data.py + data_generation_offline.py leave: a `datasets`
    save_to_disk directory (two Arrow stream files, state.json) and one hs_<row>.safetensors per
    row with the vLLM connector's tensors, from the target's real hidden states."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(target).eval()
    rows = [tokenize_conversation(tok, c, MAX_LEN) for c in convs]
    dst.mkdir()
    (dst / "hidden_states").mkdir()
    features = {k: {"feature": {"dtype": "int64", "_type": "Value"}, "_type": "List"}
                for k in ("input_ids", "loss_mask")}
    features["seq_len"] = {"dtype": "int64", "_type": "Value"}
    schema = pa.schema([("input_ids", pa.list_(pa.int64())), ("loss_mask", pa.list_(pa.int64())),
                        ("seq_len", pa.int64())],
                       metadata={"huggingface": json.dumps({"info": {"features": features}})})
    half = len(rows) // 2
    names = ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]
    for name, part in zip(names, (rows[:half], rows[half:]), strict=True):
        batch = pa.record_batch([pa.array([r.input_ids for r in part], pa.list_(pa.int64())),
                                 pa.array([r.loss_mask for r in part], pa.list_(pa.int64())),
                                 pa.array([len(r.input_ids) for r in part], pa.int64())],
                                schema=schema)
        with pa.OSFile(str(dst / name), "wb") as sink, pa.ipc.new_stream(sink, schema) as w:
            w.write_batch(batch)
    (dst / "state.json").write_text(json.dumps({
        "_data_files": [{"filename": n} for n in names], "_fingerprint": "0" * 16,
        "_format_columns": None, "_format_kwargs": {}, "_format_type": None,
        "_output_all_columns": False, "_split": None}, indent=2))
    (dst / "dataset_info.json").write_text(json.dumps({"features": features}))
    ids_k = [2, LAYERS // 2, LAYERS - 3]
    pre: dict[str, torch.Tensor] = {}
    h = model.model.norm.register_forward_pre_hook(lambda _m, a: pre.update(x=a[0]))
    for i, r in enumerate(rows):
        with torch.no_grad():
            hs = model(torch.tensor([r.input_ids]), output_hidden_states=True).hidden_states
        # vLLM ids k < N: input of layer k == HF hidden_states[k]; id N: last output, pre-norm
        layers = [hs[k][0] for k in ids_k] + [pre["x"][0]]
        save_file({"hidden_states": torch.stack(layers, 1).contiguous(),
                   "token_ids": torch.tensor(r.input_ids, dtype=torch.int64)},
                  str(dst / "hidden_states" / f"hs_{i}.safetensors"))
    h.remove()


@pytest.fixture(scope="module")
def dirs(target8: Path, tok: Any, tmp_path_factory: pytest.TempPathFactory
         ) -> tuple[Path, Path]:
    """(our prepared directory, a speculators directory) for the same conversations."""
    d = tmp_path_factory.mktemp("spec")
    src = d / "conv.jsonl"
    convs = write_sharegpt(src)[:8]
    src.write_text("".join(src.read_text().splitlines(keepends=True)[:8]))
    run_engine("prepare", "--target", str(target8), "--data", str(src), "--out", str(d / "ours"),
               "--max-len", str(MAX_LEN), "--batch-tokens", "200")
    write_speculators_dir(target8, convs, tok, d / "spec")
    return d / "ours", d / "spec"


def test_speculators_dir_reads_the_same_tensors_as_ours(target8: Path, dirs: Any) -> None:
    ours, spec = dirs
    a = open_data(str(ours))
    by_ids = {tuple(a[i].input_ids.tolist()): a[i] for i in range(len(a))}
    for path in (spec, spec / "hidden_states"):  # either directory may be named
        b = open_data(str(path), target_dir=str(target8))
        assert b.meta["format"] == "speculators-offline" and len(b) == len(a) == 8
        assert b.aux_layer_ids is None and b.hidden_size == 32
        for i in range(len(b)):
            s = b[i]
            o = by_ids[tuple(s.input_ids.tolist())]
            assert torch.equal(s.loss_mask, o.loss_mask)
            assert b.tokens(i)[1].tolist() == s.loss_mask.tolist()
            torch.testing.assert_close(s.aux, o.aux, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(s.hidden, o.hidden, atol=1e-5, rtol=1e-5)
        assert torch.equal(b.token_counts(200), a.token_counts(200))


def test_training_reads_a_speculators_dir(target8: Path, dirs: Any, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run_engine("train", "--target", str(target8), "--data", str(dirs[1]), "--out", str(run),
               "--max-steps", "2", "--batch-tokens", "256", "--draft-vocab-size", "64",
               "--holdout", "0", "--ttt-steps", "2")
    assert json.loads((run / "run.json").read_text())["status"] == "done"


def test_partial_generation_run_leaves_rows_out(target8: Path, dirs: Any, tmp_path: Path) -> None:
    spec = tmp_path / "spec"
    shutil.copytree(dirs[1], spec)
    (spec / "hidden_states" / "hs_3.safetensors").unlink()
    d = open_data(str(spec), target_dir=str(target8))
    assert len(d) == 7 and d.meta["rows_without_hidden_states"] == 1


def test_malformed_speculators_dir_is_one_clear_error(target8: Path, dirs: Any,
                                                      tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file
    spec = tmp_path / "spec"
    shutil.copytree(dirs[1], spec)
    hs1 = spec / "hidden_states" / "hs_1.safetensors"
    t = load_file(str(hs1))
    save_file({**t, "token_ids": t["token_ids"].flip(0).contiguous()}, str(hs1))
    p = run_engine("train", "--target", str(target8), "--data", str(spec), "--out",
                   str(tmp_path / "run"), "--max-steps", "1", check=False)
    assert p.returncode == 1
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {hs1}: token_ids (") and "differ from row 1's input_ids" in last

    save_file({**t, "hidden_states": t["hidden_states"][:, 1:].contiguous()}, str(hs1))
    with pytest.raises(EngineError, match=r"hs_1.safetensors: hidden_states shape \[\d+, 3, 32\]"):
        open_data(str(spec), target_dir=str(target8))
    save_file({"hidden_states": t["hidden_states"]}, str(hs1))
    with pytest.raises(EngineError, match="hs_1.safetensors: tensor 'token_ids' is missing"):
        open_data(str(spec), target_dir=str(target8))

    shutil.copy(dirs[1] / "hidden_states" / "hs_1.safetensors", hs1)
    no_target = open_data(str(spec))
    assert no_target.tokens(0)[0].numel() > 0  # token-only readers (vocab, eval) need no target
    with pytest.raises(EngineError, match="needs the target"):
        no_target[0]
