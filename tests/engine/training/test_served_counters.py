"""train --eval-server's arithmetic without a server: vLLM's /metrics page read into counters
(summed over engines, per position), the deltas of one replay as acceptance figures, the URL
refused off the loopback, and the weight version the console's `swap` would write; and its
requests' error answers (a raw server on 127.0.0.1) worded with the server's own reason."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from engine.errors import EngineError
from engine.training.served_eval import (
    ServedEval,
    check_url,
    figures,
    parse_counters,
    weight_version,
)
from tests.raw_http_server import RawHttpServer, answer

PAGE = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="t"}} {d}
vllm:spec_decode_num_drafts_created{{engine="0",model_name="t"}} 1.7e9
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="t"}} {dt}
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="t"}} {a}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="t",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="t",position="1"}} {p1}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="1",model_name="t",position="1"}} 1.0
vllm:generation_tokens_total{{engine="0",model_name="t"}} {g}
vllm:num_requests_running{{engine="0",model_name="t"}} 0.0
"""


def test_counters_and_the_figures_of_their_deltas() -> None:
    before = parse_counters(PAGE.format(d=10.0, dt=20.0, a=12.0, p0=8.0, p1=4.0, g=40.0))
    after = parse_counters(PAGE.format(d=30.0, dt=60.0, a=42.0, p0=26.0, p1=16.0, g=100.0))
    assert (before.drafts, before.accepted, before.generation_tokens) == (10.0, 12.0, 40.0)
    assert before.per_position == {0: 8.0, 1: 5.0}          # engine 1's position 1 added
    fig = figures(before, after)
    assert fig == {"acceptance_length": 1 + 30 / 20, "drafts": 20, "draft_tokens": 40,
                   "accepted": 30, "pos_0": 18 / 20, "pos_1": 12 / 20}
    assert figures(before, before)["acceptance_length"] is None    # nothing drafted


@pytest.mark.parametrize("url", ["http://gpu-box.invalid:8000", "https://127.0.0.1:8000",
                                 "http://127.0.0.1", "http://127.0.0.1:8000/v1"])
def test_an_eval_server_off_the_loopback_is_refused(url: str) -> None:
    with pytest.raises(EngineError, match="--eval-server"):
        check_url(url)
    assert check_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"


def test_weight_version_is_the_swap_commands(tmp_path: Path) -> None:
    d = tmp_path / "step_000050"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"weights")
    assert weight_version(d) == \
        "step_000050@" + hashlib.sha256(b"weights").hexdigest()[:16]
    (d / "model-2.safetensors").write_bytes(b"more")
    lines = "".join(f"{n} {hashlib.sha256(b).hexdigest()}\n" for n, b in
                    (("model-2.safetensors", b"more"), ("model.safetensors", b"weights")))
    assert weight_version(d) == \
        "step_000050@" + hashlib.sha256(lines.encode()).hexdigest()[:16]


def test_an_error_answer_is_worded_with_the_servers_reason() -> None:
    deep = b'{"error": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"   # past the recursion limit
    vllm = b'{"error": {"message": "weights not found in /x", "code": 400}}'
    srv = RawHttpServer({
        "/vllm": lambda s, c: c.sendall(answer("400 Bad Request", vllm)),
        "/html": lambda s, c: c.sendall(answer("502 Bad Gateway", b"<html>down</html>\nmore")),
        "/deep": lambda s, c: c.sendall(answer("400 Bad Request", deep)),
    })
    try:
        ev = ServedEval(f"http://127.0.0.1:{srv.port}", [], 1, deadline_s=10)
        for path, why in (("/vllm", "HTTP 400: weights not found in /x"),
                          ("/html", "HTTP 502: <html>down</html>"),
                          ("/deep", "HTTP 400: " + deep.decode()[:500])):
            with pytest.raises(EngineError) as e:
                ev.call("POST", path, {})
            assert str(e.value) == f"--eval-server: POST {ev.url}{path}: {why}", path
    finally:
        srv.stop()
