"""engine/fileio.py: the atomic writers, the JSON reader and the file sha256 the engine shares."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from engine.errors import EngineError
from engine.fileio import (
    atomic_dir,
    atomic_file,
    open_regular,
    read_json,
    replace_dir,
    sha256_file,
    write_json,
    write_text,
)
from tests.interrupts import interrupt_everywhere


class Boom(Exception):
    pass


def test_atomic_file_that_raises_midway_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    dst = tmp_path / "a.json"
    dst.write_text("old\n")
    with pytest.raises(Boom), atomic_file(dst) as tmp:
        tmp.write_text("half")
        raise Boom
    assert dst.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["a.json"]


def test_atomic_file_replaces_only_when_complete(tmp_path: Path) -> None:
    dst = tmp_path / "a.txt"
    write_text(dst, "one\n")
    write_json(tmp_path / "b.json", {"k": [1, 2]})
    assert dst.read_text() == "one\n"
    assert read_json(tmp_path / "b.json") == {"k": [1, 2]}
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "b.json"]


def test_atomic_dir_that_raises_midway_leaves_dst_untouched_and_no_temp(tmp_path: Path) -> None:
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep").write_text("old")
    with pytest.raises(Boom), atomic_dir(dst) as tmp:
        (tmp / "new").write_text("half")
        raise Boom
    assert os.listdir(dst) == ["keep"] and (dst / "keep").read_text() == "old"
    assert os.listdir(tmp_path) == ["out"]


def test_atomic_dir_replaces_an_existing_dst_and_removes_the_old_one(tmp_path: Path) -> None:
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep").write_text("old")
    with atomic_dir(dst) as tmp:
        assert not (dst / "new").exists()  # DST stays the old one until the block is done
        (tmp / "new").write_text("new")
    assert os.listdir(dst) == ["new"]
    assert os.listdir(tmp_path) == ["out"]


def test_replace_dir_replaces_a_symlink_as_a_name_never_its_target(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "x").write_text("x")
    (tmp_path / "link").symlink_to(real)
    new = tmp_path / "new"
    new.mkdir()
    replace_dir(new, tmp_path / "link")
    assert (real / "x").read_text() == "x"
    assert (tmp_path / "link").is_dir() and not (tmp_path / "link").is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["link", "real"]


def test_atomic_dir_never_removes_a_temp_it_did_not_make(tmp_path: Path) -> None:
    taken = tmp_path / ".out.tmp"
    taken.mkdir()
    (taken / "theirs").write_text("x")
    with pytest.raises(FileExistsError), atomic_dir(tmp_path / "out", tmp=taken):
        pass
    assert (taken / "theirs").exists()


@pytest.mark.parametrize(("text", "words"), [
    ('{"a": 1,\n  "b": }\n', ["bad.json", "not valid JSON", "line 2"]),
    ("[1, 2]\n", ["bad.json", "not a JSON object"]),
    (b"\xff\xfe", ["bad.json", "not valid JSON"]),
])
def test_read_json_names_the_file_and_line(tmp_path: Path, text: str | bytes,
                                           words: list[str]) -> None:
    p = tmp_path / "bad.json"
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    with pytest.raises(EngineError) as e:
        read_json(p)
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg


def test_read_json_missing_file_and_fifo(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match=r"nope\.json: does not exist"):
        read_json(tmp_path / "nope.json")
    with pytest.raises(EngineError, match="nope.json: missing here"):
        read_json(tmp_path / "nope.json", missing="missing here")
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(EngineError, match="not a regular file"):  # and it does not block
        read_json(tmp_path / "fifo.json")
    assert read_json_list(tmp_path) == [1]


def read_json_list(d: Path) -> list[int]:
    (d / "l.json").write_text("[1]")
    data = read_json(d / "l.json", obj=False)
    assert isinstance(data, list)
    return data


@pytest.mark.parametrize("size", [0, 1, 4096, 3 * 65536 + 17])
def test_sha256_equals_hashlib_over_several_windows(tmp_path: Path, size: int) -> None:
    p = tmp_path / "w.bin"
    p.write_bytes(os.urandom(size))
    assert sha256_file(p, window=65536) == hashlib.sha256(p.read_bytes()).hexdigest()
    assert sha256_file(p) == hashlib.sha256(p.read_bytes()).hexdigest()


def test_ctrl_c_anywhere_in_open_regular_is_the_interrupt_never_ebadf(tmp_path: Path) -> None:
    """A stop signal landed just after os.fdopen had taken the descriptor: the file object closed
    it on the way out and the cleanup closed it again, so convert said `OSError: [Errno 9] Bad
    file descriptor` instead of `interrupted` (once, in CI)."""
    f = tmp_path / "a.bin"
    f.write_bytes(b"x" * 10)

    def read() -> None:
        with open_regular(f, buffering=0) as r:
            assert r.read() == b"x" * 10

    points = interrupt_everywhere(read, [open_regular, os.fdopen])
    assert points > 10  # the trace really stepped through both functions
