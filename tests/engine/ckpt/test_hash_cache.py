"""Remembered sha256 digests: a second conversion of the same source skips hashing, and any change
to a file (even one that keeps its size and mtime) is hashed again."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from engine.ckpt import hash_cache
from engine.ckpt.converter import convert_checkpoint
from tests.drafters import write_drafter


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def weight_files(out: Path) -> dict[str, dict[str, object]]:
    return json.loads((out / "provenance.json").read_text())["source"]["weight_files"]


@pytest.fixture
def no_fresh_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    # Test files are seconds old; the two-second freshness guard has its own test below.
    monkeypatch.setattr(hash_cache, "FRESH_S", -1.0)


def test_second_conversion_takes_the_digests_from_the_cache(tmp_path: Path,
                                                            no_fresh_guard: None) -> None:
    src = tmp_path / "src"
    write_drafter(src, layout="sharded")
    convert_checkpoint(src, tmp_path / "a", "vllm")
    convert_checkpoint(src, tmp_path / "b", "speculators", verifier="org/target")
    first, second = weight_files(tmp_path / "a"), weight_files(tmp_path / "b")
    assert len(first) == 2 and set(first) == set(second)
    for name in first:
        assert first[name]["sha256"] == second[name]["sha256"] == sha(src / name)
        assert first[name]["sha256_from"] == "computed"
        assert second[name]["sha256_from"] == "cache"
    assert hash_cache.cache_path().is_file()
    assert str(hash_cache.cache_path()).startswith(str(tmp_path))  # the isolated XDG cache


def test_a_rewritten_file_with_the_same_size_and_mtime_is_hashed_again(
        tmp_path: Path, no_fresh_guard: None) -> None:
    p = tmp_path / "w.safetensors"
    p.write_bytes(b"a" * 4096)
    digest, cached = hash_cache.sha256_files([p])[str(p)]
    assert not cached and hash_cache.sha256_files([p])[str(p)] == (digest, True)
    st = os.stat(p)
    with open(p, "r+b") as f:  # same size, then the old mtime put back: only ctime tells
        f.write(b"b")
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(p).st_mtime_ns == st.st_mtime_ns and os.stat(p).st_size == st.st_size
    new, cached = hash_cache.sha256_files([p])[str(p)]
    assert not cached and new == sha(p) != digest


def test_a_file_written_just_now_is_not_remembered(tmp_path: Path) -> None:
    p = tmp_path / "w.safetensors"
    p.write_bytes(b"x" * 1000)
    assert hash_cache.sha256_files([p])[str(p)] == (sha(p), False)
    assert hash_cache.sha256_files([p])[str(p)] == (sha(p), False)


def test_disabled_or_damaged_cache_still_gives_true_digests(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_fresh_guard: None) -> None:
    p = tmp_path / "w.safetensors"
    p.write_bytes(b"y" * 1000)
    hash_cache.cache_path().parent.mkdir(parents=True)
    hash_cache.cache_path().write_text("{not json")
    assert hash_cache.sha256_files([p])[str(p)] == (sha(p), False)   # damaged: rebuilt
    assert hash_cache.sha256_files([p])[str(p)] == (sha(p), True)
    monkeypatch.setenv("EAGLE3_HASH_CACHE", "0")
    assert hash_cache.sha256_files([p])[str(p)] == (sha(p), False)
