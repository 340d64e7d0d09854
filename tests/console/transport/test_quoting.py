"""Hostile strings through both transports: arguments, env values, working directories and file
paths full of shell syntax arrive byte-identical, and none of the commands hidden in them runs
(each would create MARKER; it must never exist)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from console.transport import Transport, quote

pytestmark = pytest.mark.timeout(60)

def no_marker_anywhere(tmp_path: Path) -> bool:
    """Path components cannot hold `/`, so commands hidden in them touch a relative MARKER:
    look where a shell would have run them (the test folder, the login home, our own cwd)."""
    found = list(tmp_path.rglob("MARKER"))
    found += [p for p in (Path.home() / "MARKER", Path.cwd() / "MARKER") if p.exists()]
    return not found


ECHO_ARGV = ("import json, os, sys; "
             "print(json.dumps([os.getcwd(), os.environ.get('E3_W'), sys.argv[1:]]))")


def hostile(marker: Path) -> list[str]:
    m = str(marker)
    return [
        "plain", "two words", "  lead and trail  ", "", "it's", 'say "hi"', "mixed '\" quotes",
        f"$(touch {m})", f"`touch {m}`", f"; touch {m}", f"&& touch {m}", f"| touch {m}",
        f"|| touch {m}", f"\ntouch {m}\n", f"a\nb; touch {m}", f"> {m}", f"$(echo hi > {m})",
        "*", "?", "[a-z]*", "~", "~/x", "$HOME", "${PATH}", "\\", "\\n", "-n", "--", "#comment",
        "tab\there", "ünïcødé ✓", "!bang", "{a,b}", "%s%d",
    ]


async def test_argv_env_and_cwd_arrive_intact(transport: Transport, tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    words = hostile(marker)
    cwd = tmp_path / "d i r $(touch MARKER) 'q' \"dq\" ; `touch MARKER` *"
    cwd.mkdir()
    value = f"v $(touch {marker}) ' \" ; `x` \n end"
    r = await transport.run([sys.executable, "-c", ECHO_ARGV, *words], cwd=str(cwd),
                            env={"E3_W": value}, check=True)
    got_cwd, got_env, got_argv = json.loads(r.stdout)
    assert got_argv == words
    assert got_env == value
    assert got_cwd == str(cwd)
    lines = [x async for x in transport.stream([sys.executable, "-c", ECHO_ARGV, *words])]
    assert json.loads(lines[0])[2] == words
    assert not marker.exists() and no_marker_anywhere(tmp_path)
    assert sorted(os.listdir(tmp_path)) == [cwd.name]  # nothing else was created


async def test_scripts_with_quoted_parts(transport: Transport, tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    words = hostile(marker)
    r = await transport.run_script("printf '%s\\0' " + " ".join(quote(w) for w in words),
                                   check=True)
    assert r.stdout.split("\0")[:-1] == words
    assert not marker.exists()


async def test_files_at_hostile_paths(transport: Transport, tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    folder = tmp_path / "up $(touch MARKER) ; `touch MARKER` && 'q' \"d\" *?["
    name = "f 'q' \"d\" $(touch MARKER)\nsecond line | touch MARKER & ; *.txt"
    src = tmp_path / "src.bin"
    src.write_bytes(b"payload \x00\xff")
    dst = folder / name
    assert await transport.upload([(str(src), str(dst))]) == src.stat().st_size
    assert dst.read_bytes() == src.read_bytes()  # exactly that name, on disk
    st = await transport.stat(str(dst))
    assert st is not None and st.size == src.stat().st_size
    assert await transport.read_range(str(dst), 8, 10) == b"\x00\xff"
    other = folder / f"w {name}"
    await transport.write_bytes(str(other), b"written")
    assert other.read_bytes() == b"written"
    r = await transport.run(["cat", "--", str(other)], check=True)
    assert r.stdout == "written"
    await transport.remove([str(dst), str(other)])
    assert os.listdir(folder) == []
    assert not marker.exists() and no_marker_anywhere(tmp_path)
    assert sorted(os.listdir(tmp_path)) == sorted([folder.name, "src.bin"])
