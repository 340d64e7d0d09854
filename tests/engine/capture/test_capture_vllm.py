"""Features through vLLM's hidden-state extraction: `prepare --from-vllm`, `capture-server` and
streamed training, against a stand-in vLLM server (tests/vllm_standin.py) on the demo target."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.capture.vllm_capture import prepare_from_vllm
from engine.capture.vllm_client import VllmClient
from engine.data.chat import tokenize_conversation
from engine.data.conversations import read_conversations
from engine.data.readers import open_data
from engine.data.target import load_tokenizer
from engine.errors import EngineError
from engine.events import Emitter
from tests.engine_helpers import REPO, engine_env, events, kill_after_shards, run_engine
from tests.raw_http_server import RawHttpServer, answer
from tests.vllm_standin import VllmStandin

pytest_plugins = ("tests.demo_workspace",)

MAX_LEN = "512"  # the demo's data/ was prepared with max_len 512
SMALL = 24  # conversations in the fault tests
SHARD_MB = 0.2  # small shards: a resumed run has several to keep
BATCH = 256  # target batch tokens: shards are whole batches (the transformers path's plan)


def quiet() -> Emitter:
    return Emitter("prepare", out=io.StringIO(), err=io.StringIO())


@pytest.fixture
def standin(tmp_path: Path, demo_dir: Path) -> Iterator[Callable[..., VllmStandin]]:
    """Start stand-in servers on the demo target (closed at the end); storage under tmp_path."""
    started: list[VllmStandin] = []

    def start(**kw: Any) -> VllmStandin:
        kw.setdefault("storage", str(tmp_path / "hs"))
        s = VllmStandin(str(demo_dir / "target"), **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        if not s.dead:
            s.close()


@pytest.fixture(scope="module")
def small_convs(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    lines = (demo_dir / "conversations" / "train.jsonl").read_text().splitlines()[:SMALL]
    p = tmp_path_factory.mktemp("small") / "conv.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.fixture(scope="module")
def small_ref(demo_dir: Path, small_convs: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> Path:
    """An uninterrupted capture of the small set from a healthy server."""
    d = tmp_path_factory.mktemp("ref")
    s = VllmStandin(str(demo_dir / "target"), str(d / "hs"))
    try:
        capture(demo_dir, small_convs, str(d / "data"), s, concurrency=4)
    finally:
        s.close()
    assert len(json.loads((d / "data" / "manifest.json").read_text())["shards"]) >= 4
    return d / "data"


def capture(demo_dir: Path, convs: Path, out: str, server: VllmStandin, **kw: Any
            ) -> dict[str, Any]:
    """prepare_from_vllm on the small set with the fault tests' sizes."""
    kw = {"max_len": int(MAX_LEN), "shard_mb": SHARD_MB, "batch_tokens": BATCH, "ev": quiet(),
          **kw}
    return prepare_from_vllm(str(demo_dir / "target"), str(convs), out, server.url,
                             server_storage=server.storage, **kw)


def same_directory(got: Path, want: Path) -> None:
    """Same files; shards with the same samples, ids and masks, features to float tolerance (the
    server's batching, like vLLM's, moves the last bits); the manifest apart from timings."""
    from safetensors import safe_open
    assert sorted(p.name for p in got.iterdir()) == sorted(p.name for p in want.iterdir())
    for p in want.glob("shard_*.safetensors"):
        with safe_open(str(p), "pt") as a, safe_open(str(got / p.name), "pt") as b:
            assert a.metadata() == b.metadata() and set(a.keys()) == set(b.keys())
            for k in a.keys():  # noqa: SIM118
                x, y = a.get_tensor(k), b.get_tensor(k)
                if x.is_floating_point():
                    torch.testing.assert_close(y, x, atol=1e-5, rtol=1e-5)
                else:
                    assert torch.equal(x, y), (p.name, k)
    a, b = (json.loads((d / "manifest.json").read_text()) for d in (got, want))
    for m in (a, b):
        m.pop("seconds"), m.pop("created"), m["capture"].pop("tokens_per_s")
    assert a == b


def sample_ids(convs: Path, demo_dir: Path) -> dict[tuple[int, ...], str]:
    tok = load_tokenizer(str(demo_dir / "target"))
    return {tuple(tokenize_conversation(tok, c.turns, int(MAX_LEN)).input_ids): c.id
            for c in read_conversations(str(convs))}


# -- prepare --from-vllm ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def full_capture(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> tuple[Path, list[dict[str, Any]], list[str]]:
    """The demo's train.jsonl through the CLI: (DATA_DIR, events, server files left)."""
    d = tmp_path_factory.mktemp("full")
    s = VllmStandin(str(demo_dir / "target"), str(d / "hs"))
    try:
        p = run_engine("prepare", "--target", str(demo_dir / "target"), "--data",
                       str(demo_dir / "conversations" / "train.jsonl"), "--out", str(d / "data"),
                       "--max-len", MAX_LEN, "--from-vllm", s.url + "/v1", "--concurrency", "8",
                       "--server-storage", s.storage,
                       "--events")
    finally:
        s.close()
    return d / "data", [json.loads(line) for line in p.stdout.splitlines()], s.files()


@pytest.mark.slow
def test_from_vllm_equals_the_transformers_path(demo_dir: Path, full_capture: Any) -> None:
    out, evs, left = full_capture
    want, got = (json.loads((d / "manifest.json").read_text()) for d in (demo_dir / "data", out))
    assert got["capture"]["via"] == "vllm" and got["capture"]["layer_ids"] == [2, 3, 4, 7]
    for m in (want, got):
        for k in ("seconds", "created", "capture"):
            m.pop(k, None)
        m["target"].pop("path"), m["source"].pop("path")  # demo init built under a temp name
    assert got == want  # same samples, tokens, masks, dtype, layer ids and shard boundaries
    a, b = open_data(str(demo_dir / "data")), open_data(str(out))
    assert len(a) == len(b) == want["samples"]
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert torch.equal(x.input_ids, y.input_ids) and torch.equal(x.loss_mask, y.loss_mask)
        torch.testing.assert_close(y.aux, x.aux, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(y.hidden, x.hidden, atol=1e-4, rtol=1e-4)  # final norm applied
    assert left == []  # every server file deleted once a shard held it
    prog = [e for e in evs if e["kind"] == "progress" and e["desc"] == "capture"]
    assert prog[-1]["done"] == prog[-1]["total"] == want["samples"]
    assert any(e["rate"] and e["eta_s"] is not None for e in prog)
    assert evs[-1]["kind"] == "result" and evs[-1]["data"]["samples"] == want["samples"]


def test_transient_failures_are_retried(standin: Any, demo_dir: Path, small_convs: Path,
                                        small_ref: Path, tmp_path: Path) -> None:
    s = standin(fail_first=3, drop_next=2)
    capture(demo_dir, small_convs, str(tmp_path / "data"), s, concurrency=3, backoff=0.01)
    same_directory(tmp_path / "data", small_ref)
    assert s.attempts >= SMALL + 5 and len(s.answered) == SMALL and s.files() == []


def test_server_death_aborts_then_resume_requests_only_what_is_missing(
        standin: Any, demo_dir: Path, small_convs: Path, small_ref: Path, tmp_path: Path) -> None:
    out = tmp_path / "data"
    args = ("prepare", "--target", str(demo_dir / "target"), "--data", str(small_convs),
            "--out", str(out), "--max-len", MAX_LEN, "--concurrency", "2")
    first = standin(die_after=11)
    with pytest.raises(EngineError) as e:
        capture(demo_dir, small_convs, str(out), first, concurrency=2, max_failures=3)
    assert f"{first.url}: 3 requests failed in a row" in str(e.value)
    assert "rerun the same command to resume" in str(e.value)
    assert not out.exists()
    kept = json.loads((tmp_path / "data.partial" / "progress.json").read_text())["shards"]
    assert 0 < sum(s["samples"] for s in kept) < 11
    # the CLI says the same in one line
    p = run_engine(*args[:6], str(tmp_path / "other"), *args[7:], "--from-vllm", first.url,
                   "--server-storage", first.storage, "--max-failures", "2", check=False)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines()[-1].startswith(
        f"error: {first.url}: 2 requests failed in a row (last: ")
    second = standin(port=0)
    capture(demo_dir, small_convs, str(out), second, concurrency=2)
    same_directory(out, small_ref)
    before = {tuple(x) for x in first.answered}
    after = {tuple(x) for x in second.answered}
    assert len(first.answered) == len(before) and len(second.answered) == len(after)
    assert not before & after  # nothing requested twice: received files were read on resume
    assert len(before | after) == SMALL
    assert second.files() == [] and not (tmp_path / "data.partial").exists()


@pytest.mark.slow
def test_killed_capture_resumes_to_the_same_directory(standin: Any, demo_dir: Path,
                                                      tmp_path: Path) -> None:
    s = standin(slow_write_s=0.02)
    out = tmp_path / "data"
    conv = demo_dir / "conversations" / "train.jsonl"
    args = [sys.executable, "-m", "engine", "prepare", "--target", str(demo_dir / "target"),
            "--data", str(conv), "--out", str(out), "--max-len", MAX_LEN, "--from-vllm", s.url,
            "--server-storage", s.storage, "--concurrency", "4", "--shard-mb", "1",
            "--batch-tokens", "1024"]
    progress = tmp_path / "data.partial" / "progress.json"
    held = kill_after_shards(args, progress, timeout=120)
    n_held = sum(x["samples"] for x in held)
    tok_of = sample_ids(demo_dir / "conversations" / "train.jsonl", demo_dir)
    from safetensors import safe_open
    in_shards = set()
    for x in held:
        with safe_open(str(tmp_path / "data.partial" / x["file"]), "pt") as f:
            in_shards |= set(json.loads(f.metadata()["ids"]))
    first = len(s.answered)
    s.slow_write_s = 0.0
    run_engine(*args[3:])
    ref = tmp_path / "ref"
    prepare_from_vllm(str(demo_dir / "target"), str(conv), str(ref), s.url,
                      server_storage=s.storage,
                      max_len=int(MAX_LEN), shard_mb=1, batch_tokens=1024, ev=quiet())
    same_directory(out, ref)
    again = [tok_of[tuple(x)] for x in s.answered[first:len(s.answered) - 320]]
    assert not in_shards & set(again)  # the kept shards' samples were not requested again
    assert len(again) <= 320 - n_held
    # left: only what the server wrote for requests in flight at the kill (never received)
    assert len(s.files()) <= 2 * 4


def test_a_kill_between_a_shard_and_its_cleanup_leaks_no_server_file(
        standin: Any, demo_dir: Path, small_convs: Path, small_ref: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The worst moment for a kill: the first shard is recorded in progress.json and its server
    files are not deleted yet. The resumed run deletes them (they are still in pending.jsonl);
    before the fix they stayed on the server's volume for good (~100 MB per sample at scale)."""
    import engine.capture.vllm_capture as capture_mod

    class Killed(BaseException):
        pass

    def killed_here(*_a: Any, **_k: Any) -> None:
        raise Killed

    s = standin()
    out = tmp_path / "data"
    with monkeypatch.context() as m:
        m.setattr(capture_mod.ServerStorage, "remove", killed_here)
        with pytest.raises(Killed):
            capture(demo_dir, small_convs, str(out), s, concurrency=1)
    shards = json.loads((tmp_path / "data.partial" / "progress.json").read_text())["shards"]
    assert len(shards) == 1 and shards[0]["samples"] >= 2
    assert len(s.files()) >= 2 * shards[0]["samples"]  # the shard's files and their locks
    capture(demo_dir, small_convs, str(out), s, concurrency=1)
    same_directory(out, small_ref)
    # left: at most the one request in flight at the kill, whose answer nobody read
    assert len(s.files()) <= 2, s.files()


def test_wrong_token_ids_and_nan_are_rejected_naming_the_sample(
        standin: Any, demo_dir: Path, small_convs: Path, tmp_path: Path) -> None:
    ids = sample_ids(small_convs, demo_dir)
    bad_ids, bad_sid = sorted(ids.items())[5]
    s = standin(wrong_ids_for={bad_ids})
    out = tmp_path / "data"
    p = run_engine("prepare", "--target", str(demo_dir / "target"), "--data", str(small_convs),
                   "--out", str(out), "--max-len", MAX_LEN, "--from-vllm", s.url,
                   "--server-storage", s.storage, check=False)
    assert p.returncode == 1
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: sample {bad_sid!r}: the server's file {s.storage}/"), last
    assert "holds other token ids than were sent" in last and "rerun the same command" in last
    assert not out.exists()
    nan_ids, nan_sid = sorted(ids.items())[7]
    s2 = standin(nan_for={nan_ids}, storage=str(tmp_path / "hs2"))
    with pytest.raises(EngineError, match=f"sample {nan_sid!r}: non-finite values in "
                       r"hidden_states of .* \(position \d+, layer id 7\)"):
        prepare_from_vllm(str(demo_dir / "target"), str(small_convs), str(tmp_path / "d2"),
                          s2.url, max_len=int(MAX_LEN), ev=quiet(), server_storage=s2.storage)


def test_slow_writes_are_read_after_the_servers_lock(standin: Any, demo_dir: Path,
                                                     small_convs: Path, small_ref: Path,
                                                     tmp_path: Path) -> None:
    s = standin(slow_write_s=0.05)  # half a file on disk for 50 ms: only the flock protects
    capture(demo_dir, small_convs, str(tmp_path / "data"), s, concurrency=4)
    same_directory(tmp_path / "data", small_ref)


def test_refused_when_the_disk_cannot_hold_the_estimate(demo_dir: Path, small_convs: Path,
                                                        tmp_path: Path) -> None:
    big = tmp_path / "big-target"  # config + tokenizer only: nothing else is read before the check
    big.mkdir()
    cfg = json.loads((demo_dir / "target" / "config.json").read_text())
    cfg["hidden_size"] = 10 ** 12
    (big / "config.json").write_text(json.dumps(cfg))
    for f in (demo_dir / "target").iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            (big / f.name).write_bytes(f.read_bytes())
    out = tmp_path / "data"
    p = run_engine("prepare", "--target", str(big), "--data", str(small_convs), "--out", str(out),
                   "--max-len", MAX_LEN, "--from-vllm", "http://127.0.0.1:9", "--dtype",
                   "bfloat16", check=False)
    assert p.returncode == 1
    tokens = sum(len(k) for k in sample_ids(small_convs, demo_dir))
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {tmp_path}: not enough disk space: the output needs about ")
    assert f"({tokens} tokens x 4 states x {10 ** 12} hidden x 2 bytes)" in last
    assert last.endswith(" is free")
    assert not out.exists() and not (tmp_path / "data.partial").exists()


# -- capture-server ---------------------------------------------------------------------------

def config_target(path: Path, **cfg: Any) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"vocab_size": 163840, **cfg}))
    return path


def parse_serve(argv: list[str]) -> dict[str, Any]:
    assert argv[1] == "serve"
    opts: dict[str, Any] = {"model": argv[2]}
    i = 3
    while i < len(argv):
        if argv[i] == "--no-enable-chunked-prefill":
            opts[argv[i]] = True
            i += 1
        else:
            opts[argv[i]] = argv[i + 1]
            i += 2
    return opts


@pytest.mark.parametrize("layers,want", [(7, [2, 3, 4, 7]), (61, [2, 30, 58, 61])])
def test_capture_server_print_parses_back(demo_dir: Path, tmp_path: Path, layers: int,
                                          want: list[int]) -> None:
    target = demo_dir / "target" if layers == 7 else config_target(
        tmp_path / "glm", model_type="glm4_moe", hidden_size=5120, num_hidden_layers=61)
    p = run_engine("capture-server", "--target", str(target), "--tp", "8", "--port", "8123",
                   "--storage", str(tmp_path / "hs"), "--print")
    argv = shlex.split(p.stdout.strip())
    o = parse_serve(argv)
    assert o["model"] == str(target) and o["--tensor-parallel-size"] == "8"
    assert o["--port"] == "8123" and o["--no-enable-chunked-prefill"] is True
    # the config's dtype: vLLM's auto would serve the float32 demo target in 16 bits
    assert o.get("--dtype") == ("float32" if layers == 7 else None)
    spec = json.loads(o["--speculative-config"])
    assert spec == {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                    "draft_model_config": {"hf_config": {
                        "eagle_aux_hidden_state_layer_ids": want}}}
    kv = json.loads(o["--kv-transfer-config"])
    assert kv == {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                  "kv_connector_extra_config": {"shared_storage_path": str(tmp_path / "hs")}}


def test_capture_server_execs_that_command_and_refuses_mla(demo_dir: Path, tmp_path: Path
                                                           ) -> None:
    fake = tmp_path / "vllm"  # records the argv it was exec'd with
    fake.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"open({str(tmp_path / 'argv.json')!r}, 'w').write(json.dumps(sys.argv))\n"
                    "print('INFO vllm says hello')\n")
    fake.chmod(0o755)
    common = ("capture-server", "--target", str(demo_dir / "target"), "--storage",
              str(tmp_path / "hs"))
    printed = run_engine(*common, "--print", "--json")
    p = run_engine(*common, "--vllm", str(fake), "--events")
    got = json.loads((tmp_path / "argv.json").read_text())
    assert got[1:] == json.loads(printed.stdout)["argv"][1:] and (tmp_path / "hs").is_dir()
    assert [json.loads(x)["kind"] for x in p.stdout.splitlines()] == ["log"]  # events only
    mla = config_target(tmp_path / "kimi", model_type="kimi_k2", hidden_size=7168,
                        num_hidden_layers=61, kv_lora_rank=512)
    p = run_engine("capture-server", "--target", str(mla), "--print", check=False)
    assert p.returncode == 1
    line = p.stderr.strip()
    assert line.startswith(f"error: {mla}: an MLA target (kv_lora_rank 512 in config.json")
    assert "does not support MLA" in line and "--vllm-engine" in line


# -- streamed training --------------------------------------------------------------------------

@pytest.mark.slow
def test_streamed_training_matches_offline_and_resumes(standin: Any, demo_dir: Path,
                                                       tmp_path: Path) -> None:
    """`train --online --from-vllm`: the offline run's losses step for step, killed and resumed."""
    from safetensors.torch import load_file

    from tests.engine_helpers import step_metrics, train_args
    common = ("--max-steps", "6", "--holdout", "0", "--save-every", "2")
    run_engine(*train_args(demo_dir, tmp_path / "off", *common))
    s = standin()
    args = train_args(demo_dir, tmp_path / "on", *common, "--online", "--max-len", MAX_LEN,
                      "--from-vllm", s.url, "--concurrency", "4", "--prefetch", "2",
                      "--server-storage", s.storage)
    args[args.index("--data") + 1] = str(demo_dir / "conversations" / "train.jsonl")
    run = tmp_path / "on"
    proc = subprocess.Popen([sys.executable, "-m", "engine", *args], cwd=REPO, env=engine_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 240
        while time.monotonic() < end and proc.poll() is None:
            if (run / "events.jsonl").is_file() and any(
                    e["kind"] == "metric" and e["step"] >= 3 for e in events(run / "events.jsonl")):
                break
            time.sleep(0.02)
        kids = children(proc.pid)  # the feature-streaming worker (and multiprocessing's helper)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert kids, "the streamed run has no worker process"
    end = time.monotonic() + 15
    while time.monotonic() < end and any(alive(k) for k in kids):
        time.sleep(0.05)
    assert not any(alive(k) for k in kids), "a worker outlived the killed trainer"
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000002"
    run_engine(*args, "--resume")
    off, on = step_metrics(tmp_path / "off" / "events.jsonl"), step_metrics(run / "events.jsonl")
    assert sorted(on) == sorted(off) == list(range(1, 7))
    for step, logged in on.items():
        for values in logged:  # before the kill and after the resume
            assert values["tokens"] == off[step][0]["tokens"]
            assert values["loss"] == pytest.approx(off[step][0]["loss"], rel=1e-4)
    a, b = (load_file(str(d / "final" / "model.safetensors")) for d in (tmp_path / "off", run))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-3, rtol=1e-3)
    assert json.loads((run / "run.json").read_text())["status"] == "done"
    # every file read was deleted; only requests in flight at the kill may have left theirs
    assert len(s.files()) <= 2 * 4 and len(s.answered) >= 6 * 10


def children(pid: int) -> list[int]:
    """The pids of `pid`'s children (Linux /proc)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(x) for x in (task / "children").read_text().split()]
    return out


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its new parent to reap it counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_streamed_training_error_in_the_worker_is_one_line(
        standin: Any, demo_dir: Path, small_convs: Path, tmp_path: Path) -> None:
    """A bad file read by the worker process: one `error:` line naming the sample, no worker
    left behind."""
    ids = sample_ids(small_convs, demo_dir)
    s = standin(nan_for=set(ids))
    from tests.engine_helpers import train_args
    args = train_args(demo_dir, tmp_path / "on", "--max-steps", "2", "--holdout", "0",
                      "--online", "--max-len", MAX_LEN, "--from-vllm", s.url,
                      "--server-storage", s.storage)
    args[args.index("--data") + 1] = str(small_convs)
    proc = subprocess.Popen([sys.executable, "-m", "engine", *args], cwd=REPO, env=engine_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    kids: list[int] = []
    end = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < end:
        try:
            kids = sorted(set(kids) | set(children(proc.pid)))
        except (FileNotFoundError, ProcessLookupError):
            pass
        time.sleep(0.02)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    last = err.strip().splitlines()[-1]
    assert re.match(r"error: sample '[^']+': non-finite values in hidden_states of ", last), last
    assert last.split("'")[1] in set(ids.values())
    assert kids, "no worker process"
    end = time.monotonic() + 10
    while time.monotonic() < end and any(alive(k) for k in kids):
        time.sleep(0.05)
    assert not any(alive(k) for k in kids), "a worker outlived the trainer"


@pytest.mark.slow
def test_training_on_captured_data_learns(demo_dir: Path, demo_info: dict[str, Any],
                                          full_capture: Any, tmp_path: Path) -> None:
    """A drafter trained on the --from-vllm directory beats the untrained one at acceptance."""
    from engine.ckpt.drafter_save import save_drafter
    from engine.training.config import TrainConfig
    from engine.training.setup import build
    from tests.engine_helpers import train_args
    args = train_args(demo_dir, tmp_path / "run", "--max-steps", "40", "--save-every", "0")
    args[args.index("--data") + 1] = str(full_capture[0])
    run_engine(*args, timeout=600)
    cfg = TrainConfig(target=str(demo_dir / "target"), data=str(full_capture[0]),
                      out=str(tmp_path / "x"), draft_vocab_size=demo_info["draft_vocab_size"])
    draft = build(cfg, quiet(), torch.device("cpu")).draft  # the run's starting point (seed 0)
    save_drafter(tmp_path / "untrained", draft.config, draft.trainable_state_dict(), "eagle")

    def tau(d: Path) -> float:
        p = run_engine("eval", "--draft", str(d), "--target", str(demo_dir / "target"), "--data",
                       str(demo_dir / "eval"), "--steps", "3", "--max-samples", "16", "--json")
        return float(json.loads(p.stdout)["acceptance_length"])

    before, after = tau(tmp_path / "untrained"), tau(tmp_path / "run" / "final")
    print(f"acceptance length: untrained {before:.3f}, 40 steps on --from-vllm data {after:.3f}")
    assert after > before + 0.3, (before, after)


def test_a_streamed_batch_crosses_processes_as_one_shared_buffer() -> None:
    """The worker's batches travel packed (engine/capture/online_data.py `_pack`): one shared-memory
    buffer whose views are the batch's tensors, every dtype and shape as collated, odd sizes
    and empty tensors included."""
    from engine.capture.online_data import _pack, _unpack
    g = torch.Generator().manual_seed(0)
    batch = {"aux": torch.randn(2, 7, 9, generator=g), "input_ids": torch.randint(0, 99, (2, 7)),
             "loss_mask": torch.ones(2, 7, dtype=torch.bool), "none": torch.zeros(0, 3),
             "half": torch.randn(3, generator=g).bfloat16()}
    buf, meta = _pack(batch)
    assert buf.is_shared() and buf.dtype == torch.uint8
    got = _unpack(buf, meta)
    assert list(got) == list(batch)
    for k, t in batch.items():
        assert got[k].dtype == t.dtype and torch.equal(got[k], t), k
        assert got[k].untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()


def test_a_refused_request_is_worded_with_vllms_reason() -> None:
    """An error status that is not retried: vLLM's own message, not its JSON."""
    doc = b'{"error": {"message": "prompt: token ids expected", "code": 400}}'
    srv = RawHttpServer({"/v1/completions": lambda s, c: c.sendall(answer("400 Bad Request",
                                                                          doc))})
    try:
        with pytest.raises(EngineError) as e:
            VllmClient(srv.url("/v1")).call("/v1/completions", {"prompt": "x"}, "capture")
    finally:
        srv.stop()
    assert str(e.value) == (f"capture: HTTP 400 from {srv.url('')}/v1/completions: "
                            "prompt: token ids expected"), str(e.value)
