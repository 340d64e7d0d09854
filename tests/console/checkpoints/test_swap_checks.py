"""Swap and bench without vLLM: what `serve` starts for a swappable server, the fields a swap
is refused by, the backend's read of a drafter folder (real safetensors files), the prompts a
replay sends, and the comparison's rows per server and weight version."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from console.checkpoints.answers import per_request
from console.checkpoints.bench import requests_total
from console.checkpoints.drafter_facts import facts, stated_k
from console.checkpoints.journal import SpecCounts
from console.checkpoints.prompts import parse_prompts
from console.checkpoints.serve import ServeRequest, vllm_argv, vllm_env
from console.checkpoints.swap import refusals
from console.errors import ConsoleError
from engine.capture.swap_backend import BACKEND, EXTENSION, read_drafter, shapes
from engine.ckpt.safetensors_io import save_tensors
from engine.errors import EngineError
from tests.serving_journal import parsed_rows


def test_a_swappable_server_stays_on_the_loopback_with_our_backend() -> None:
    req = ServeRequest(ckpt="/d", verifier="/t", port=8123, extra=["--max-model-len", "64"])
    argv = vllm_argv(req)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--worker-extension-cls") + 1] == EXTENSION
    assert json.loads(argv[argv.index("--weight-transfer-config") + 1]) == {"backend": BACKEND}
    assert argv[-4:] == ["--max-model-len", "64", "--host", "127.0.0.1"]
    assert vllm_env(req) == {"VLLM_SERVER_DEV_MODE": "1"}
    off = ServeRequest(ckpt="/d", verifier="/t", swappable=False)
    assert "--weight-transfer-config" not in vllm_argv(off) and vllm_env(off) == {}
    with pytest.raises(ConsoleError, match="--host 0.0.0.0: a swappable server stays on the "
                                           "loopback"):
        ServeRequest(ckpt="/d", verifier="/t", extra=["--host", "0.0.0.0"]).check()
    ServeRequest(ckpt="/d", verifier="/t", extra=["--host", "0.0.0.0"], swappable=False).check()


def report(**cfg: Any) -> dict[str, Any]:
    base = {"hidden_size": 64, "target_hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "draft_vocab_size": 96, "vocab_size": 512}
    return {"config": {**base, **cfg},
            "tensors": {"fc.weight": {"shape": [64, 192]}, "d2t": {"shape": [96]}}}


def test_what_the_running_server_cannot_take_is_refused_by_name() -> None:
    raw = {"eagle_aux_hidden_state_layer_ids": [1, 3, 5], "norm_before_fc": False}
    served = facts(report(), raw)
    assert refusals(facts(report(), raw), served, 3, None, 512) == []
    other = facts(report(draft_vocab_size=80), {**raw, "norm_before_fc": True,
                                                "eagle_aux_hidden_state_layer_ids": [0, 1, 2]})
    got = refusals(other, served, 3, 4, 1024)
    assert got == [
        "draft_vocab_size: the drafter has 80, the server runs 96",
        "aux_layer_ids: the drafter has [0, 1, 2], the server runs [1, 3, 5]",
        "norm_before_fc: the drafter has True, the server runs False",
        "target vocab: the drafter has 512, the verifier 1024",
        "k: the drafter's config says 4, the server runs k=3"]
    shape = report()
    shape["tensors"]["fc.weight"]["shape"] = [64, 128]
    assert refusals(facts(shape, raw), served, 3, None, None) == [
        "tensor fc.weight: the drafter has [64, 128], the server runs [64, 192]"]
    mla = facts(report(), {**raw, "kv_lora_rank": 16})
    assert refusals(mla, served, 3, None, None) == [
        "layer kind: the drafter has 'mla', the server runs 'llama'"]
    assert stated_k({"speculators_config": {"proposal_methods": [{"speculative_tokens": 5}]}}) \
        == 5


def test_the_backend_reads_the_whole_drafter_before_it_touches_the_model(
        tmp_path: Path) -> None:
    served, new = tmp_path / "served", tmp_path / "new"
    for d, rows_ in ((served, 96), (new, 96)):
        d.mkdir()
        save_tensors(d / "model.safetensors", {"fc.weight": torch.ones(4, 12),
                                               "d2t": torch.arange(rows_)})
    want = shapes(served)
    assert set(read_drafter(str(new), want)) == {"fc.weight", "d2t"}
    save_tensors(new / "model.safetensors", {"fc.weight": torch.ones(4, 12),
                                             "d2t": torch.arange(80)})
    with pytest.raises(EngineError, match=r"tensor 'd2t': shape \[80\], the served drafter's "
                                          r"\[96\]"):
        read_drafter(str(new), want)
    data = (served / "model.safetensors").read_bytes()
    (new / "model.safetensors").write_bytes(data[:len(data) - 10])
    with pytest.raises(EngineError, match="truncated"):
        read_drafter(str(new), want)


def test_replayed_prompts_end_before_the_first_assistant_turn() -> None:
    text = "\n".join(json.dumps(d) for d in (
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]},
        {"prompt": "p"}, "plain"))
    assert parse_prompts(text, "f") == [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
        [{"role": "user", "content": "p"}], [{"role": "user", "content": "plain"}]]
    with pytest.raises(ConsoleError, match="f:1: no user turn"):
        parse_prompts(json.dumps({"messages": [{"role": "assistant", "content": "a"}]}), "f")
    with pytest.raises(ConsoleError, match="f:2: not JSON"):
        parse_prompts('"a"\n{', "f")


def test_compare_has_a_row_per_server_and_weight_version_and_per_replay() -> None:
    session = {"run_id": "r1", "host": "h", "drafter": "/a", "metrics": "http://x/metrics",
               "started": 1.0, "k": 3}

    def sc(t: float, version: str | None, al: float, bench: bool = False,
           drafter: str | None = None) -> dict[str, Any]:
        return {"run_id": "r1", "t": t, "weight_version": version, "bench": bench,
                "drafter": drafter, "total": {"acceptance_length": al}}

    swapped = ({"run_id": "r1", "host": "h", "drafter": "/b", "weight_version": "b@1"},
               {"run_id": "r1", "host": "h", "drafter": "/a", "weight_version": "a@2"})
    got = parsed_rows([session], [sc(2, None, 2.0), sc(3, "default", 2.1, True),
                                  sc(4, "b@1", 3.0, True, "/b"), sc(5, "b@1", 3.1, True, "/b"),
                                  sc(6, "a@2", 2.1, True, "/a")], swapped)
    assert [(r.weight_version, r.drafter, r.acceptance_length) for r in got] == [
        ("a@2", "/a", 2.1), ("b@1", "/b", 3.1), ("b@1", "/b", 3.0), ("default", "/a", 2.1),
        (None, "/a", 2.0)]


def test_per_request_acceptance_is_read_and_summed() -> None:
    """An answer's `metrics.speculative_decoding` as vLLM 0.32 writes it
    (--per-request-spec-decode-metrics summary; the real server checks the sums in
    test_vllm_swap): its figures, summed over a replay only when every answer has them."""
    spec = {"mean_acceptance_length": 2.5, "draft_acceptance_rate": 0.5,
            "acceptance_histogram": [2, 1, 0, 3], "num_spec_steps": 6,
            "num_accepted_draft_tokens": 10, "num_draft_tokens": 18, "num_spec_tokens": 3}
    one = per_request(spec)
    assert one == SpecCounts(1 + 10 / 6, drafts=6, accepted=10, draft_tokens=18,
                             histogram=(2, 1, 0, 3))
    assert per_request(None) is None and per_request({"num_spec_steps": 1}) is None
    total = requests_total([one, per_request({**spec, "num_spec_steps": 4,
                                              "num_accepted_draft_tokens": 2})])
    assert total == SpecCounts(1 + 12 / 10, drafts=10, accepted=12, draft_tokens=36)
    assert requests_total([one, None]) is None
