"""prepare at scale: torchrun ranks write one data directory, --device-map auto, disk refusal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.data.disk_estimate import estimate_bytes, human
from engine.demo.target import chats
from tests.engine_helpers import REPO, engine_env, run_engine
from tests.tiny_llama import write_sharegpt

pytest_plugins = ("tests.tiny_llama",)

# small batches and tiny shards (~200 tokens of a 32-wide float32 target each): a plan of dozens
ARGS = ["--max-len", "64", "--batch-tokens", "100", "--shard-mb", "0.0005"]
VOLATILE = ("seconds", "created")


def prepare_cli(target: Path, src: Path, out: Path, *extra: str, nproc: int = 1
                ) -> subprocess.CompletedProcess[str]:
    args = ["prepare", "--target", str(target), "--data", str(src), "--out", str(out), *ARGS,
            *extra]
    if nproc == 1:
        return run_engine(*args)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", str(nproc), "-m", "engine", *args],
                       cwd=REPO, env=engine_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    return p


def read_dir(d: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(manifest without timings, file -> {tensor name: tensor, "ids": metadata ids})."""
    from safetensors import safe_open
    m = json.loads((d / "manifest.json").read_text())
    shards: dict[str, dict[str, Any]] = {}
    for s in m["shards"]:
        with safe_open(str(d / s["file"]), "pt") as f:
            shards[s["file"]] = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
            shards[s["file"]]["ids"] = json.loads(f.metadata()["ids"])
    return {k: v for k, v in m.items() if k not in VOLATILE}, shards


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src") / "conv.jsonl"
    write_sharegpt(src)
    with open(src, "a", encoding="utf-8") as f:  # enough work that a run can be killed midway
        for n, turns in enumerate(chats(300, 11)):
            f.write(json.dumps({"id": f"c{n}", "conversations": turns}) + "\n")
    return src


@pytest.fixture(scope="module")
def single(tiny_target: Path, source: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Path:
    out = tmp_path_factory.mktemp("one") / "data"
    prepare_cli(tiny_target, source, out)
    return out


def assert_same_dir(a: Path, b: Path) -> None:
    ma, sa = read_dir(a)
    mb, sb = read_dir(b)
    assert ma == mb
    assert sorted(sa) == sorted(sb)
    for name in sa:
        assert sa[name]["ids"] == sb[name]["ids"], name
        for key in ("input_ids", "loss_mask", "offsets", "aux_hidden_states", "hidden_states"):
            assert torch.equal(sa[name][key], sb[name][key]), (name, key)


@pytest.mark.slow
def test_two_torchrun_ranks_write_the_same_directory_as_one_process(
        tiny_target: Path, source: Path, single: Path, tmp_path: Path) -> None:
    manifest = json.loads((single / "manifest.json").read_text())
    assert len(manifest["shards"]) >= 3  # both ranks get shards to write
    out = tmp_path / "data"
    p = prepare_cli(tiny_target, source, out, "--json", nproc=2)
    assert_same_dir(single, out)
    # one directory, one manifest: nothing else left beside it, rank 0 alone answered
    assert sorted(x.name for x in tmp_path.iterdir()) == ["data"]
    assert sorted(x.name for x in out.iterdir()) == sorted(
        ["manifest.json"] + [s["file"] for s in manifest["shards"]])
    assert p.stdout.count('"format": "eagle3-console-data"') == 1


@pytest.mark.slow
def test_killed_prepare_resumes_under_torchrun(tiny_target: Path, source: Path,
                                               single: Path, tmp_path: Path) -> None:
    out = tmp_path / "data"
    partial = tmp_path / "data.partial"
    total = len(json.loads((single / "manifest.json").read_text())["shards"])
    p = subprocess.Popen([sys.executable, "-m", "engine", "prepare", "--target", str(tiny_target),
                          "--data", str(source), "--out", str(out), *ARGS], cwd=REPO,
                         env=engine_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(list(partial.glob("shard_*"))) < 3 and p.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.001)
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    kept = {f.name: f.stat().st_ino for f in partial.glob("shard_*.safetensors")}
    assert not out.exists() and 3 <= len(kept) < total
    r = prepare_cli(tiny_target, source, out, nproc=2)
    assert f"resuming, {len(kept)} of {total} shards already written" in r.stderr
    assert_same_dir(single, out)
    assert {n: (out / n).stat().st_ino for n in kept} == kept  # kept, not computed again
    assert sorted(x.name for x in tmp_path.iterdir()) == ["data"]


def test_device_map_auto_on_cpu_maps_everything_to_the_cpu(
        tiny_target: Path, source: Path, single: Path, tmp_path: Path) -> None:
    out = tmp_path / "data"
    prepare_cli(tiny_target, source, out, "--device-map", "auto")
    assert_same_dir(single, out)


def test_estimate_matches_the_bytes_prepare_writes(single: Path) -> None:
    m = json.loads((single / "manifest.json").read_text())
    est = estimate_bytes(m["tokens"], 4, m["target"]["hidden_size"], 4)
    written = sum((single / s["file"]).stat().st_size for s in m["shards"])
    # the rest is safetensors headers (ids metadata) and offsets: a few KB per shard
    assert est <= written <= est + 8192 * len(m["shards"])
    # docs/eagle3.md#the-hidden-states-connector: 4 x 7168 x bf16 is ~57 KB a token, 50k x 2k
    # tokens ~5.7 TB
    assert human(estimate_bytes(50_000 * 2_000, 4, 7168, 2)) == "5.7 TB"


def test_prepare_refuses_when_the_disk_cannot_hold_it(tiny_target: Path, source: Path,
                                                      single: Path, tmp_path: Path) -> None:
    tokens = json.loads((single / "manifest.json").read_text())["tokens"]
    out = tmp_path / "data"
    p = run_engine("prepare", "--target", str(tiny_target), "--data", str(source), "--out",
                   str(out), *ARGS, "--keep-free-gb", "1e9", check=False)
    assert p.returncode == 1
    last = p.stderr.strip().splitlines()[-1]  # after the tokenize progress bar
    assert last.startswith(f"error: {tmp_path}: not enough disk space: the output needs about ")
    assert f"({tokens} tokens x 4 states x 32 hidden x 4 bytes)" in last and " is free" in last
    assert list(tmp_path.iterdir()) == []  # refused before writing anything


def test_device_map_ranks_split_the_nodes_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.data.target import local_gpus
    from engine.errors import EngineError
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)  # a node this machine is not
    assert local_gpus() == list(range(8))  # no torchrun: every GPU
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    for rank, want in (("0", [0, 1, 2, 3]), ("1", [4, 5, 6, 7])):
        monkeypatch.setenv("LOCAL_RANK", rank)
        assert local_gpus() == want
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    with pytest.raises(EngineError, match="16 processes per node share 8 GPU"):
        local_gpus()
