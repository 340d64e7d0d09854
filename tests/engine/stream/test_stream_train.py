"""Training from a stream: a producer (`engine stream-put` over the demo's data directory) puts
samples into a real Mooncake master on 127.0.0.1 and a 2-process torchrun trainer (gloo, CPU)
reads them (`train --from-stream`). The losses and the final weights are the offline run's on
the same directory bit for bit: the same float32 tensors reach the same ops in the same order
(same plan, same ranks, same reduction), so the tolerance is zero. The store never holds more
than the producer's high watermark plus the run's manifest and plan, and nothing is left in it
at the end. Killed with SIGKILL, the trainer (then the producer, then the producer again) and
started again with the same command, the run trains on every sample of its plan once per step and
ends on the uninterrupted run's weights, the store bounded throughout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine.stream import keys
from engine.stream import manifest as mf
from engine.stream import plan_order as po
from engine.stream.master import Master
from engine.stream.store import StoreClient
from tests.engine_helpers import REPO, engine_env, events, train_args
from tests.stream_store import CountWatch, numbers, store_count, torchrun
from tests.waiting import wait_until

pytest_plugins = ("tests.demo_workspace", "tests.stream_store")
pytestmark = pytest.mark.usefixtures("mooncake")

STEPS = 6
HOLDOUT = 4
COMMON = ["--max-steps", str(STEPS), "--holdout", str(HOLDOUT), "--save-every", "3",
          "--batch-tokens", "512", "--ttt-steps", "2"]
SMALL_KEYS = 5  # the run's manifest, plan, progress and heartbeat, and a waiting rank's record


@pytest.fixture(scope="module")
def marks(demo_dir: Path) -> tuple[int, int]:
    """The pool's (high, low) watermarks in samples: the held-out samples and the largest step
    of the 2-rank plan (of its first two epochs: the run is 6 steps), so the producer pauses;
    the trainer refuses a smaller pool. Counted from the demo's data, whose lengths (and so the
    steps) vary with the machine that built it."""
    from engine.data.readers import open_data
    from engine.training.plan import epoch_steps, split_holdout
    data = open_data(str(demo_dir / "data"))
    train, _ = split_holdout(len(data), HOLDOUT)
    group = 2  # world size 2, no accumulation
    step = max(len(s.samples()) for e in range(2)
               for s in epoch_steps(train, list(data.lengths), 512, group, 0, e))
    return HOLDOUT + step, HOLDOUT + step - 5


@pytest.fixture(scope="module")
def offline(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted offline run (2-process torchrun) every streamed run must equal."""
    out = tmp_path_factory.mktemp("offline") / "run"
    torchrun(*train_args(demo_dir, out, *COMMON))
    return out


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


def finish(prod: subprocess.Popen[bytes], timeout: float) -> int | None:
    """The producer's exit code, or None where it had not ended within `timeout` (then
    killed): the caller's assertions say which side failed and why."""
    try:
        return prod.wait(timeout)
    except subprocess.TimeoutExpired:
        return None
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
                                                  offline: Path, marks: tuple[int, int],
                                                  tmp_path: Path) -> None:
    (high, low), base = marks, store_count(stream_master)
    logs = tmp_path / "producer"
    prod = producer(demo_dir, stream_master, "equal", logs, "--high-samples", str(high),
                    "--low-samples", str(low), "--high-gb", "0.25", "--plan-timeout", "120")
    streamed = tmp_path / "streamed"
    with CountWatch(stream_master) as watch:
        # a producer that dies ends the run with its error, not a wait as long as the suite's
        p = torchrun(*stream_args(demo_dir, stream_master, "equal", streamed,
                                  "--producer-timeout", "60"), check=False)
        rc = finish(prod, 120 if p.returncode == 0 else 1)
    assert p.returncode == 0, p.stderr[-3000:] + (logs / "err").read_text()[-2000:]
    assert rc == 0, (logs / "err").read_text()[-3000:]
    out = (logs / "out").read_text()
    want, got = numbers(offline), numbers(streamed)
    assert sorted(got) == list(range(1, STEPS + 1)) and got == want
    a, b = (load_file(str(r / "final" / "model.safetensors")) for r in (offline, streamed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the pool: the high watermark (+ the small keys) at most, nothing evicted, nothing left
    assert watch.seen > 10 and watch.peak <= base + high + SMALL_KEYS, watch.peak
    assert store_count(stream_master, "master_evicted_key_count") == 0
    assert store_count(stream_master) == base
    assert store_count(stream_master) == base
    evs = [json.loads(x) for x in out.splitlines()]
    result = [e["data"] for e in evs if e["kind"] == "result"][0]
    assert result["peak_in_flight"] <= high and result["pauses"] >= 1
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


def start_trainer(argv: list[str], logs: Path) -> subprocess.Popen[bytes]:
    """A 2-process torchrun trainer, its output in files."""
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "out", "wb") as out, open(logs / "err", "wb") as err:
        return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                 "--nproc-per-node", "2", "-m", "engine", *argv], cwd=REPO,
                                env=engine_env(), stdout=out, stderr=err)


def kill_tree(p: subprocess.Popen[bytes]) -> None:
    """SIGKILL a process and its descendants (torchrun starts its workers in sessions of
    their own: a process-group kill would miss them)."""
    family, kids = [p.pid], {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        kids.setdefault(int(text[text.rindex(")") + 2:].split()[1]), []).append(
            int(stat.parent.name))
    for pid in family:
        family += kids.get(pid, [])
    for pid in family:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait()


def records(run: Path, step: int) -> int:
    """How many times the run's events hold training step `step` (a resumed step: twice)."""
    if not (run / "events.jsonl").is_file():
        return 0
    return sum(1 for e in events(run / "events.jsonl")
               if e["kind"] == "metric" and "name" not in e and e["step"] == step)


def said(path: Path, words: str) -> list[str]:
    """The log messages of an events file (a command's stdout, a run's events.jsonl) holding
    `words`."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        e = json.loads(line) if line.startswith("{") else {}
        if e.get("kind") == "log" and words in e.get("msg", ""):
            out.append(e["msg"])
    return out


def paused_now(logs: Path) -> bool:
    """The producer is waiting on its pool (its last pause not followed by a resume)."""
    both = said(logs / "out", "stream producer ")
    marks = [m for m in both if m.startswith(("stream producer paused",
                                              "stream producer resumed"))]
    return bool(marks) and marks[-1].startswith("stream producer paused")


def freeze_while_paused(p: subprocess.Popen[bytes], logs: Path) -> None:
    """SIGSTOP the producer at a moment its log says it waits on a full pool, so it still has a
    sample of the plan to put and the trainer must come to wait on it. A stop that lands just
    after it resumed (its log has moved on) is undone and tried at the next pause."""
    while True:
        wait_until(lambda: paused_now(logs), 300, "the producer paused on its pool")
        p.send_signal(signal.SIGSTOP)
        if paused_now(logs):
            return
        p.send_signal(signal.SIGCONT)


def trained_on(run: Path) -> dict[int, tuple[int, list[int]]]:
    """step -> (epoch, samples) as the run's events record them, the last record of a step
    (the resumed run's) winning."""
    out = {}
    for m in said(run / "events.jsonl", "trained on epoch"):
        words = m.split()
        out[int(words[3])] = (int(words[7]), [int(i) for i in words[9].split(",")])
    return out


def steps_recorded(run: Path) -> int:
    """How many training-step records the run's events hold (a step done again: twice)."""
    if not (run / "events.jsonl").is_file():
        return 0
    return sum(1 for e in events(run / "events.jsonl")
               if e["kind"] == "metric" and "name" not in e)


def the_plan(m: Master, run: str) -> list[tuple[int, list[int]]]:
    """The trainer's plan as it is in the store now: (epoch, samples) of each step."""
    c = StoreClient(m.address)
    try:
        manifest = mf.decode(c.get_bytes(keys.manifest_key(run)) or b"", run)
        raw = c.get_bytes(keys.plan_key(run))
        assert raw is not None
        plan = po.decode(raw, run, len(manifest.lengths))
    finally:
        c.close()
    return [(e, list(idx)) for e, idx in plan.steps]


@pytest.mark.slow
def test_trainer_and_producer_killed_and_started_again_train_as_if_uninterrupted(
        demo_dir: Path, stream_master: Master, offline: Path, marks: tuple[int, int],
        tmp_path: Path) -> None:
    """SIGKILL of the 2-process trainer while it waits on the producer (frozen with SIGSTOP
    while it waits on its full pool, after the trainer's first step: the trainer must come to
    wait on it), then of the producer;
    each started again with the same command (the trainer with --resume): the producer keeps
    what the store holds and skips the steps done, the trainer's new plan has it put again what
    the killed trainer took. Then the producer is killed once more while the resumed trainer
    waits on it, and started again once the trainer says it is silent. Every step trains on its
    samples of the plan (each sample once), the run ends on the uninterrupted run's numbers and
    weights, and the store never held more than the high watermark plus the run's small keys."""
    (high, low), base = marks, store_count(stream_master)
    pool = ["--high-samples", str(high), "--low-samples", str(low), "--high-gb", "0.25",
            "--plan-timeout", "120"]
    streamed = tmp_path / "streamed"
    argv = stream_args(demo_dir, stream_master, "kill", streamed)
    prods: list[subprocess.Popen[bytes]] = []
    trainers: list[subprocess.Popen[bytes]] = []
    with CountWatch(stream_master) as watch:
        try:
            prods.append(producer(demo_dir, stream_master, "kill", tmp_path / "p1", *pool))
            trainers.append(start_trainer(argv, tmp_path / "t1"))
            wait_until(lambda: steps_recorded(streamed) >= 1, 300, "step 1 of the trainer")
            waits = len(said(streamed / "events.jsonl", "waiting for sample"))  # before: the
            freeze_while_paused(prods[0], tmp_path / "p1")  # trainer may wait at once
            plan = the_plan(stream_master, "kill")
            wait_until(lambda: len(said(streamed / "events.jsonl", "waiting for sample")) > waits,
                       300, "the trainer waiting on the frozen producer")
            kill_tree(trainers[0])
            done = steps_recorded(streamed)
            prods[0].send_signal(signal.SIGCONT)
            wait_until(lambda: paused_now(tmp_path / "p1"), 300, "the producer paused")
            kill_tree(prods[0])
            prods.append(producer(demo_dir, stream_master, "kill", tmp_path / "p2", *pool))
            wait_until(lambda: said(tmp_path / "p2" / "out", "steps of its plan"), 300,
                       "the producer started again going on")
            trainers.append(start_trainer([*argv, "--resume"], tmp_path / "t2"))
            wait_until(lambda: steps_recorded(streamed) > done, 300, "a step of the resumed run")
            quiet = len(said(streamed / "events.jsonl", "producer silent for"))  # the first
            freeze_while_paused(prods[1], tmp_path / "p2")  # trainer's said so too
            wait_until(lambda: len(said(streamed / "events.jsonl", "producer silent for")) >
                       quiet, 300, "the trainer saying the producer is silent")
            kill_tree(prods[1])
            prods.append(producer(demo_dir, stream_master, "kill", tmp_path / "p3", *pool))
            rc = trainers[1].wait(300)
            assert rc == 0, (tmp_path / "t2" / "err").read_text()[-3000:]
            assert finish(prods[2], 120) == 0, (tmp_path / "p3" / "err").read_text()[-3000:]
        finally:
            for p in prods + trainers:
                if p.poll() is None:
                    p.send_signal(signal.SIGCONT)
                    kill_tree(p)
    p2 = tmp_path / "p2" / "out"
    assert said(p2, "already in the store (kept)")
    assert said(p2, f"the trainer has done {done} steps of its plan")
    assert said(p2, "producing its new plan")
    # every step trained on its samples of the plan (the last record of a step done twice)
    steps = trained_on(streamed)
    assert [steps[s] for s in sorted(steps)] == [(e, idx) for e, idx in plan]
    counts = Counter((e, i) for e, idx in steps.values() for i in idx)
    assert set(counts.values()) == {1}, counts.most_common(3)
    assert numbers(streamed) == numbers(offline)
    a, b = (load_file(str(r / "final" / "model.safetensors")) for r in (offline, streamed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    silent = [e["values"]["producer_silent_s"] for e in events(streamed / "events.jsonl")
              if e["kind"] == "metric" and e.get("name") == "stream trainer"]
    assert max(silent) >= 5
    assert watch.seen > 10 and watch.peak <= base + high + SMALL_KEYS, watch.peak
    assert store_count(stream_master, "master_evicted_key_count") == 0
    assert store_count(stream_master) == base


@pytest.mark.slow
def test_a_trainer_gives_up_on_a_silent_producer_when_told(
        demo_dir: Path, stream_master: Master, tmp_path: Path) -> None:
    """No producer ever comes: with --producer-timeout the trainer stops with one line naming
    the flag (by default it would wait on, saying so)."""
    p = subprocess.run([sys.executable, "-m", "engine", *stream_args(
        demo_dir, stream_master, "nobody", tmp_path / "run", "--producer-timeout", "2")],
        cwd=REPO, env=engine_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert "the producer has been silent for" in last and "(--producer-timeout 2)" in last
    assert "nobody/manifest" in last
