"""Training from a stream: a producer (`engine stream-put` over the demo's data directory) puts
samples into a real Mooncake master on 127.0.0.1 and a 2-process torchrun trainer (gloo, CPU)
reads them (`train --from-stream`). The losses and the final weights are the offline run's on
the same directory bit for bit: the same float32 tensors reach the same ops in the same order
(same plan, same ranks, same reduction), so the tolerance is zero. The store never holds more
than the producer's high watermark plus the run's manifest and plan, and nothing is left in it
at the end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine.stream.master import Master
from tests.engine_helpers import REPO, engine_env, events, run_engine, train_args
from tests.stream_store import CountWatch, numbers, store_count, torchrun
from tests.waiting import wait_until

pytest_plugins = ("tests.demo_workspace", "tests.stream_store")
pytestmark = pytest.mark.usefixtures("mooncake")

STEPS = 6
COMMON = ["--max-steps", str(STEPS), "--holdout", "4", "--save-every", "3", "--batch-tokens",
          "512", "--ttt-steps", "2"]
HIGH, LOW = 20, 10  # 4 held out + the largest step (11 samples) fit; the producer must pause


def producer(demo: Path, m: Master, run: str, logs: Path, *extra: str
             ) -> subprocess.Popen[bytes]:
    """`stream-put` with its events in logs/out and its stderr in logs/err (files: a pipe
    nobody reads while the trainer runs would stop it)."""
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "out", "wb") as out, open(logs / "err", "wb") as err:
        return subprocess.Popen([sys.executable, "-m", "engine", "stream-put", "--events",
                                 "--data", str(demo / "data"), "--to", str(m.address), "--run",
                                 run, *extra], cwd=REPO, env=engine_env(), stdout=out,
                                stderr=err)


def finish(prod: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        return prod.wait(timeout)
    finally:
        if prod.poll() is None:
            prod.kill()
            prod.wait()


def stream_args(demo: Path, m: Master, run: str, out: Path, *extra: str) -> list[str]:
    args = train_args(demo, out, *COMMON, *extra)
    i = args.index("--data")
    return [*args[:i], "--from-stream", str(m.address), "--data", run, *args[i + 2:]]


@pytest.mark.slow
def test_streamed_training_equals_the_offline_run(demo_dir: Path, stream_master: Master,
                                                  tmp_path: Path) -> None:
    offline = tmp_path / "offline"
    torchrun(*train_args(demo_dir, offline, *COMMON))
    base = store_count(stream_master)
    logs = tmp_path / "producer"
    prod = producer(demo_dir, stream_master, "equal", logs, "--high-samples", str(HIGH),
                    "--low-samples", str(LOW), "--high-gb", "0.25", "--plan-timeout", "120")
    streamed = tmp_path / "streamed"
    with CountWatch(stream_master) as watch:
        p = torchrun(*stream_args(demo_dir, stream_master, "equal", streamed), check=False)
        rc = finish(prod, 120 if p.returncode == 0 else 1)
    assert p.returncode == 0, p.stderr[-3000:]
    assert rc == 0, (logs / "err").read_text()[-3000:]
    out = (logs / "out").read_text()
    want, got = numbers(offline), numbers(streamed)
    assert sorted(got) == list(range(1, STEPS + 1)) and got == want
    a, b = (load_file(str(r / "final" / "model.safetensors")) for r in (offline, streamed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the pool: the high watermark (+ manifest and plan) at most, nothing evicted, nothing left
    assert watch.seen > 10 and watch.peak <= base + HIGH + 2, watch.peak
    assert store_count(stream_master, "master_evicted_key_count") == 0
    assert store_count(stream_master) == base
    assert store_count(stream_master) == base
    evs = [json.loads(x) for x in out.splitlines()]
    result = [e["data"] for e in evs if e["kind"] == "result"][0]
    assert result["peak_in_flight"] <= HIGH and result["pauses"] >= 1
    assert any("stream producer paused" in e.get("msg", "") for e in evs)
    waits = [e["values"] for e in events(streamed / "events.jsonl")
             if e["kind"] == "metric" and e.get("name") == "stream trainer"]
    assert len(waits) == STEPS and all(w["waits"] >= 0 for w in waits)
    run = json.loads((streamed / "run.json").read_text())
    assert run["data_sha256"] == json.loads((offline / "run.json").read_text())["data_sha256"]


@pytest.mark.slow
def test_a_pool_too_small_for_one_step_is_refused(demo_dir: Path, stream_master: Master,
                                                  tmp_path: Path) -> None:
    logs = tmp_path / "producer"
    prod = producer(demo_dir, stream_master, "small", logs, "--high-samples", "3",
                    "--low-samples", "1", "--high-gb", "0.25", "--plan-timeout", "3")
    p = subprocess.run([sys.executable, "-m", "engine", *stream_args(
        demo_dir, stream_master, "small", tmp_path / "run")], cwd=REPO, env=engine_env(),
        capture_output=True, text=True, timeout=300)
    rc = finish(prod, 60)
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert "cannot hold the held-out samples and one step" in last and "Traceback" not in p.stderr
    assert rc != 0 and "no trainer asked for samples within 3 s" in (logs / "err").read_text()


@pytest.mark.slow
def test_a_trainer_killed_and_resumed_trains_as_if_uninterrupted(
        demo_dir: Path, stream_master: Master, tmp_path: Path) -> None:
    """SIGKILL of the trainer after step 4 (its last checkpoint: step 3), then the same command
    with --resume: its new plan makes the producer put again what the killed trainer had
    already taken, and the run ends on the offline run's numbers and weights."""
    offline = tmp_path / "offline"
    run_engine(*train_args(demo_dir, offline, *COMMON))
    base = store_count(stream_master)
    logs = tmp_path / "producer"
    prod = producer(demo_dir, stream_master, "resume", logs, "--high-samples", str(HIGH),
                    "--low-samples", str(LOW), "--high-gb", "0.25", "--plan-timeout", "120")
    streamed = tmp_path / "streamed"
    argv = [sys.executable, "-m", "engine", *stream_args(demo_dir, stream_master, "resume",
                                                         streamed)]
    trainer = subprocess.Popen(argv, cwd=REPO, env=engine_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: 4 in numbers(streamed) if (streamed / "events.jsonl").is_file()
                   else False, 300, "step 4 of the streamed run")
        trainer.kill()
    finally:
        trainer.kill()
        trainer.wait()
    p = subprocess.run([*argv, "--resume"], cwd=REPO, env=engine_env(), capture_output=True,
                       text=True, timeout=300)
    rc = finish(prod, 120 if p.returncode == 0 else 1)
    assert p.returncode == 0, p.stderr[-3000:]
    assert rc == 0, (logs / "err").read_text()[-3000:]
    assert "producing its new plan" in (logs / "out").read_text()
    assert numbers(streamed) == numbers(offline)  # each step's last record: the resumed one
    a, b = (load_file(str(r / "final" / "model.safetensors")) for r in (offline, streamed))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert store_count(stream_master, "master_evicted_key_count") == 0
    assert store_count(stream_master) == base
