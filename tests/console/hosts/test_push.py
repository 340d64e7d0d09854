"""Incremental push over the real test sshd and the local transport: idempotence, change
detection, excludes, --delete, odd file names, the recorded manifest, and doctor on a fresh host."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from console.cli import main as cli_main
from console.hosts.engine_client import doctor
from console.hosts.host import Host
from console.hosts.push import ENGINE_DIR, Tree, engine_trees, host_trees, push
from console.hostside.manifest import Ignore, manifest_hash, scan
from console.settings.config import Config, HostConfig, SyncSet, local_host
from tests.sshd import SSHD

ODD = ["with space.txt", "quote'single.txt", 'quote"double.txt', "semi;colon $(echo x) `y`.txt",
       "dir with space/nested & amp.py", "ünïcode/ðata.txt"]


def host_cfg(kind: str, request: pytest.FixtureRequest, root: Path,
             name: str = "box") -> HostConfig:
    if kind == "local":
        return HostConfig(name=name, ssh=None, python=sys.executable, root=str(root))
    sshd: SSHD = request.getfixturevalue("sshd")
    return HostConfig(name=name, ssh=sshd.target, known_hosts=str(sshd.known_hosts),
                      identity=str(sshd.user_key), python=sys.executable, root=str(root))


def make_tree(src: Path) -> None:
    for rel in ODD + ["keep.py", "build/out.bin", "notes.log", "sub/notes.log"]:
        p = src / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"content of {rel}\n")
    (src / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (src / "run.sh").chmod(0o755)
    (src / "__pycache__").mkdir()
    (src / "__pycache__" / "x.pyc").write_bytes(b"\0")


@pytest.fixture(params=["local", "ssh"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_push_sends_only_changes(kind: str, request: pytest.FixtureRequest,
                                       tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "remote dir" / "train's"
    make_tree(src)
    host = Host(host_cfg(kind, request, tmp_path / "root"))
    tree = Tree("train", src, str(dst), ("build/", "*.log", "!sub/notes.log"))
    try:
        first = await push(host, [tree])
        t = first.trees[0]
        expected = set(ODD) | {"keep.py", "run.sh", "sub/notes.log"}
        assert t.sent == t.files == len(expected)
        got = {str(p.relative_to(dst)) for p in dst.rglob("*") if p.is_file()}
        assert got == expected                      # excludes honoured, re-include honoured
        for rel in expected:
            assert (dst / rel).read_bytes() == (src / rel).read_bytes()
        assert os.access(dst / "run.sh", os.X_OK)   # mode kept
        assert int((dst / "keep.py").stat().st_mtime) == int((src / "keep.py").stat().st_mtime)

        again = await push(host, [tree])
        assert (again.trees[0].sent, again.bytes_sent) == (0, 0)
        assert again.manifest == first.manifest

        # same size, new content, within the same second: the hash catches it
        (src / "keep.py").write_text("CONTENT of keep.py\n")
        (src / "new file.txt").write_text("new\n")
        third = await push(host, [tree])
        assert third.trees[0].sent == 2
        assert (dst / "keep.py").read_text() == "CONTENT of keep.py\n"
        assert third.manifest != first.manifest

        # an edit made on the host: the record is trusted by default, --verify scans and repairs
        (dst / "run.sh").write_text("#!/bin/sh\necho tampered\n")
        assert (await push(host, [tree])).trees[0].sent == 0
        assert (await push(host, [tree], verify=True)).trees[0].sent == 1
        assert (dst / "run.sh").read_text() == "#!/bin/sh\necho hi\n"
        assert (await push(host, [tree], verify=True)).trees[0].sent == 0

        # removals: kept without --delete, removed with it; excluded remote files never
        (src / ODD[3]).unlink()
        (dst / "build").mkdir()
        (dst / "build" / "remote-only.bin").write_bytes(b"x")
        kept = await push(host, [tree])
        assert (kept.trees[0].extra, kept.trees[0].deleted) == (1, 0)
        assert (dst / ODD[3]).exists()
        gone = await push(host, [tree], delete=True)
        assert (gone.trees[0].deleted, gone.trees[0].sent) == (1, 0)
        assert not (dst / ODD[3]).exists()
        assert (dst / "build" / "remote-only.bin").exists()

        # the record of the push is on the host
        root = Path(await host.root())
        records = [json.loads(p.read_text()) for p in (root / "manifests").glob("*.json")]
        rec = next(r for r in records if r["name"] == "train")
        assert rec["hash"] == gone.trees[0].hash == manifest_hash(rec["files"])
    finally:
        await host.close()


async def test_engine_always_pushed_and_doctor_on_fresh_host(sshd: SSHD, tmp_path: Path) -> None:
    host = Host(HostConfig(name="fresh", ssh=sshd.target, known_hosts=str(sshd.known_hosts),
                           identity=str(sshd.user_key), python=sys.executable,
                           root=str(tmp_path / "fresh root")))
    try:
        report = await doctor(host)        # nothing pushed yet: ensure_engine does it
        assert report["engine"] and report["python"]
        code = Path(await host.code_dir())
        assert (code / "engine" / "cli.py").read_bytes() == (ENGINE_DIR / "cli.py").read_bytes()
        assert (code / "eagle3_hostside" / "manifest.py").exists()
        again = await push(host, await engine_trees(host))
        assert again.files_sent == 0
    finally:
        await host.close()


def test_push_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "scripts"
    src.mkdir()
    (src / "a.py").write_text("print(1)\n")
    box = HostConfig(name="box", python=sys.executable, root=str(tmp_path / "root"))
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.box]\npython = "{sys.executable}"\nroot = "{box.root}"\n'
                   f'[sync.scripts]\nhost = "box"\nlocal = "{src}"\n'
                   f'remote = "{tmp_path / "dst"}"\n')
    assert cli_main(["--config", str(cfg), "push", "box", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    names = {t["name"]: t for t in out["trees"]}
    assert set(names) == {"engine", "hostside", "scripts"}
    assert names["scripts"]["sent"] == 1 and out["files_sent"] >= 3
    assert (tmp_path / "dst" / "a.py").exists()
    assert cli_main(["--config", str(cfg), "push", "box"]) == 0
    text = capsys.readouterr().out
    assert "0 files, 0 bytes sent" in text
    assert cli_main(["--config", str(cfg), "push", "box", "nosuch"]) == 1
    assert "unknown sync set 'nosuch'" in capsys.readouterr().err


async def test_host_trees_default_sets(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    cfg = Config(hosts={"local": local_host()},
                 syncs={"a": SyncSet("a", "local", str(tmp_path / "a"), "~/a"),
                        "b": SyncSet("b", "other", str(tmp_path / "b"), "/b")})
    host = Host(cfg.hosts["local"])
    trees = await host_trees(host, cfg, None)
    assert [t.name for t in trees] == ["engine", "hostside", "a"]
    assert trees[2].remote == os.path.join(os.path.expanduser("~"), "a")


@pytest.mark.parametrize("patterns,path,is_dir,excluded", [
    (["*.log"], "a/b/c.log", False, True),
    (["/top.txt"], "sub/top.txt", False, False),
    (["/top.txt"], "top.txt", False, True),
    (["build/"], "build", False, False),       # a file named build is not the folder
    (["build/"], "x/build", True, True),
    (["docs/*.md"], "docs/a.md", False, True),
    (["docs/*.md"], "docs/sub/a.md", False, False),
    (["docs/**/*.md"], "docs/sub/deep/a.md", False, True),
    (["**/cache"], "a/b/cache", True, True),
    (["*.log", "!keep.log"], "keep.log", False, False),
    (["file?.txt"], "file1.txt", False, True),
    (["file[0-9].txt"], "filex.txt", False, False),
    (["# comment", ""], "# comment", False, False),
])
def test_ignore_patterns(patterns: list[str], path: str, is_dir: bool, excluded: bool) -> None:
    assert Ignore(patterns).excluded(path, is_dir) is excluded


def test_scan_skips_excluded_folders_entirely(tmp_path: Path) -> None:
    (tmp_path / "node_modules" / "x").mkdir(parents=True)
    (tmp_path / "node_modules" / "x" / "keep.js").write_text("x")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("x")
    (tmp_path / "a.txt").write_text("a")
    # a folder cannot be re-included below an excluded parent (git's rule)
    assert set(scan(str(tmp_path), ["node_modules/", "!node_modules/x/keep.js"])) == {"a.txt"}
