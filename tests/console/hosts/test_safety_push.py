"""Push safety: --delete removes only files a push wrote; records cannot reach out of
their tree; dangerous sync remotes are refused; non-UTF-8 names; --verify repairs what push owns
(bytecode caches included); stale upload temps are cleaned; a full disk is named as such.
Real sshd, real files, a real tmpfs for the full disk."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from console.cli import main as cli_main
from console.errors import CommandFailed, ConfigError, Unreachable
from console.hosts.host import Host
from console.hosts.push import Tree, engine_trees, push, sync_tree
from console.settings.config import HostConfig, SyncSet, load_config
from console.transport import tempfiles
from tests.paths import REPO
from tests.sshd import SSHD


def ssh_host(sshd: SSHD, root: Path, name: str = "h1") -> HostConfig:
    return HostConfig(name=name, ssh=sshd.target, known_hosts=str(sshd.known_hosts),
                      identity=str(sshd.user_key), python=sys.executable, root=str(root))


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(params=["local", "ssh"])
def host(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    root = tmp_path / "root"
    if request.param == "local":
        cfg = HostConfig(name="h1", ssh=None, python=sys.executable, root=str(root))
    else:
        cfg = ssh_host(request.getfixturevalue("sshd"), root)
    return Host(cfg)


# -- 2: --delete removes only what a push wrote ---------------------------------------------------

async def test_delete_spares_files_push_did_not_write(host: Host, tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "existing"
    src.mkdir()
    dst.mkdir()
    (src / "mine.txt").write_text("mine\n")
    (src / "same.txt").write_text("identical on both sides\n")
    (dst / "precious.txt").write_text("the user's own\n")
    (dst / "same.txt").write_text("identical on both sides\n")
    (dst / "sub").mkdir()
    (dst / "sub" / "data.bin").write_bytes(b"\1\2\3")
    tree = Tree("work", src, str(dst))
    try:
        first = await push(host, [tree], delete=True)       # --delete on the very first push
        assert (dst / "precious.txt").exists()
        assert first.trees[0].deleted == 0 and first.trees[0].foreign == 2
        for verify in (False, True, False):
            await push(host, [tree], verify=verify)
            await push(host, [tree], delete=True)
            assert (dst / "precious.txt").read_text() == "the user's own\n"
            assert (dst / "sub" / "data.bin").exists()
        # a local file that was already at the remote, identical: we never wrote that copy
        (src / "same.txt").unlink()
        await push(host, [tree], delete=True)
        assert (dst / "same.txt").exists()
        # what we did write goes with --delete (and only with it)
        (src / "mine.txt").unlink()
        kept = await push(host, [tree])
        assert kept.trees[0].extra == 1 and (dst / "mine.txt").exists()
        gone = await push(host, [tree], delete=True, verify=True)
        assert gone.trees[0].deleted == 1 and not (dst / "mine.txt").exists()
        assert files_under(dst) == {"precious.txt", "same.txt", "sub/data.bin"}
    finally:
        await host.close()


async def test_record_from_before_the_fix_does_not_license_deletes(host: Host,
                                                                 tmp_path: Path) -> None:
    """A record the old code wrote already lists the user's file under `kept`."""
    src, dst = tmp_path / "src", tmp_path / "existing"
    src.mkdir()
    dst.mkdir()
    (src / "mine.txt").write_text("mine\n")
    (dst / "precious.txt").write_text("the user's own\n")
    tree = Tree("work", src, str(dst))
    try:
        await push(host, [tree])
        rec_path = next((Path(await host.root()) / "manifests").glob("existing-*.json"))
        rec = json.loads(rec_path.read_text())
        old = {k: rec[k] for k in ("name", "local", "remote", "hash", "git", "time", "files")}
        old["kept"] = {"precious.txt": [15, 0.0, "0" * 64]}     # what the old first push wrote
        rec_path.write_text(json.dumps(old))
        await push(host, [tree], delete=True)
        assert (dst / "precious.txt").read_text() == "the user's own\n"
        (src / "mine.txt").unlink()                             # its `files` were pushed: ours
        assert (await push(host, [tree], delete=True)).trees[0].deleted == 1
        assert files_under(dst) == {"precious.txt"}
    finally:
        await host.close()


async def test_hand_edited_record_cannot_reach_outside_the_tree(host: Host, tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "area" / "dst"
    src.mkdir()
    (src / "a.txt").write_text("a\n")
    outside = tmp_path / "area" / "outside.txt"
    outside.parent.mkdir(parents=True)
    outside.write_text("not in the sync root\n")
    absolute = tmp_path / "absolute.txt"
    absolute.write_text("absolute\n")
    tree = Tree("work", src, str(dst))
    try:
        await push(host, [tree])
        rec_path = next((Path(await host.root()) / "manifests").glob("dst-*.json"))
        rec = json.loads(rec_path.read_text())
        entry = rec["files"]["a.txt"]
        for bad in ("../outside.txt", str(absolute), "./../outside.txt", "x/../../outside.txt"):
            rec["kept"][bad] = entry
            rec["files"][bad] = entry
        rec_path.write_text(json.dumps(rec))
        report = await push(host, [tree], delete=True)
        assert outside.read_text() == "not in the sync root\n"
        assert absolute.exists()
        assert any("../outside.txt" in w and "ignoring" in w for w in report.warnings)
        assert all("\n" not in w for w in report.warnings)
        assert (dst / "a.txt").exists()
        assert (await push(host, [tree], delete=True)).warnings == []   # the record was healed
    finally:
        await host.close()


def test_push_command_prints_record_warnings_on_one_line(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    src, dst = tmp_path / "src", tmp_path / "area" / "dst"
    src.mkdir()
    (src / "a.txt").write_text("a\n")
    outside = tmp_path / "area" / "outside.txt"
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.h1]\npython = "{sys.executable}"\nroot = "{tmp_path / "root"}"\n'
                   f'[sync.s]\nhost = "h1"\nlocal = "{src}"\nremote = "{dst}"\n')
    assert cli_main(["--config", str(cfg), "push", "h1", "s"]) == 0
    outside.write_text("keep me\n")
    rec_path = next((tmp_path / "root" / "manifests").glob("dst-*.json"))
    rec = json.loads(rec_path.read_text())
    rec["kept"]["../outside.txt"] = rec["files"]["a.txt"]
    rec_path.write_text(json.dumps(rec))
    capsys.readouterr()
    assert cli_main(["--config", str(cfg), "push", "h1", "s", "--delete"]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert len(lines) == 1 and "'../outside.txt'" in lines[0] and "Traceback" not in err
    assert outside.read_text() == "keep me\n"


async def test_file_changed_on_host_is_not_deleted_after_a_scan(host: Host,
                                                                tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "notes.txt").write_text("pushed\n")
    tree = Tree("work", src, str(dst))
    try:
        await push(host, [tree])
        (dst / "notes.txt").write_text("edited on the host\n")   # now the host user's
        (src / "notes.txt").unlink()
        report = await push(host, [tree], delete=True, verify=True)
        assert report.trees[0].deleted == 0
        assert (dst / "notes.txt").read_text() == "edited on the host\n"
        await push(host, [tree], delete=True)                     # and it stays not ours
        assert (dst / "notes.txt").exists()
    finally:
        await host.close()


@pytest.mark.parametrize("remote,root", [
    ("/", "/srv/eagle3"),
    ("/srv", "/srv/eagle3"),
    ("/srv/eagle3", "/srv/eagle3"),
    ("/srv/eagle3/", "/srv/eagle3"),
    ("/srv/eagle3/code", "/srv/eagle3"),
    ("/srv/eagle3/code/engine", "/srv/eagle3"),
    ("/srv/eagle3/runs", "/srv/eagle3"),
    ("/srv/other/../eagle3/runs/x", "/srv/eagle3"),
    ("~", "~/eagle3"),
    ("~/eagle3/code", "~/eagle3"),
])
def test_config_refuses_sync_remote_over_console_folders(tmp_path: Path, remote: str,
                                                         root: str) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.h1]\nssh = "h1"\nroot = "{root}"\n'
                   f'[sync.danger]\nhost = "h1"\nlocal = "{tmp_path}"\nremote = "{remote}"\n')
    with pytest.raises(ConfigError) as e:
        load_config(cfg)
    msg = str(e.value)
    assert str(cfg) in msg and "[sync.danger] remote" in msg and "\n" not in msg


@pytest.mark.parametrize("remote", ["/srv/eagle3/scripts", "/srv/eagle3-data", "/srv/codex",
                                    "~/train"])
def test_config_accepts_ordinary_sync_remotes(tmp_path: Path, remote: str) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.h1]\nssh = "h1"\nroot = "/srv/eagle3"\n'
                   f'[sync.ok]\nhost = "h1"\nlocal = "{tmp_path}"\nremote = "{remote}"\n')
    assert load_config(cfg).syncs["ok"].remote == remote


async def test_home_relative_remote_checked_once_resolved(tmp_path: Path) -> None:
    # config time cannot compare `~` with an absolute root; push time can
    home = os.path.expanduser("~")
    host = Host(HostConfig(name="h1", ssh=None, python=sys.executable,
                           root=os.path.join(home, "eagle3-test-root")))
    with pytest.raises(ConfigError, match=r"\[sync.s\] remote = '~'"):
        await sync_tree(host, SyncSet("s", "h1", str(tmp_path), "~"))


# -- 5: a file name that is not UTF-8 ----------------------------------------------------------

async def test_non_utf8_name_pushed_over_ssh(sshd: SSHD, tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    raw = b"caf\xe9 \xff.txt"                              # Latin-1, not UTF-8
    with open(os.path.join(os.fsencode(src), raw), "wb") as f:
        f.write(b"latin-1 named\n")
    (src / "plain.txt").write_text("plain\n")
    host = Host(ssh_host(sshd, tmp_path / "root"))
    tree = Tree("work", src, str(dst))
    try:
        first = await push(host, [tree])
        assert first.trees[0].sent == 2
        with open(os.path.join(os.fsencode(dst), raw), "rb") as f:
            assert f.read() == b"latin-1 named\n"           # the very bytes of the name
        assert (await push(host, [tree])).files_sent == 0   # later pushes work
        assert (await push(host, [tree], verify=True)).files_sent == 0
        os.unlink(os.path.join(os.fsencode(src), raw))
        gone = await push(host, [tree], delete=True)
        assert gone.trees[0].deleted == 1
        assert os.listdir(os.fsencode(dst)) == [b"plain.txt"]
    finally:
        await host.close()


# -- 6: --verify repairs pushed files and the code's bytecode caches -----------------------------

async def test_verify_repairs_truncated_files_and_bytecode(sshd: SSHD, tmp_path: Path) -> None:
    host = Host(ssh_host(sshd, tmp_path / "root"))
    try:
        await push(host, await engine_trees(host))
        code = Path(await host.code_dir())
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHONDONTWRITE")}
        env["PYTHONPATH"] = str(code)
        # the host ran the runner once (bytecode written), then a full disk truncated things
        subprocess.run([sys.executable, "-c", "import eagle3_hostside.runner"], env=env,
                       check=True)
        pyc = next((code / "eagle3_hostside" / "__pycache__").glob("runner.*.pyc"))
        pyc.write_bytes(pyc.read_bytes()[:20])
        cli = code / "engine" / "cli.py"
        good_cli = cli.read_bytes()
        cli.write_bytes(good_cli[: len(good_cli) // 2])
        # same size and mtime, other bytes: only reading the file can tell
        manifest = code / "eagle3_hostside" / "manifest.py"
        st = manifest.stat()
        manifest.write_bytes(b"#" * st.st_size)
        os.utime(manifest, ns=(st.st_atime_ns, st.st_mtime_ns))
        broken = subprocess.run([sys.executable, "-c", "import eagle3_hostside.runner"],
                                env=env, capture_output=True, text=True)
        assert broken.returncode != 0 and "marshal" in broken.stderr

        report = await push(host, await engine_trees(host), verify=True)
        assert report.files_sent == 2
        assert cli.read_bytes() == good_cli
        assert manifest.read_bytes() == (REPO / "console" / "hostside" / "manifest.py").read_bytes()
        subprocess.run([sys.executable, "-c", "import eagle3_hostside.runner"], env=env,
                       check=True)
        assert (await push(host, await engine_trees(host), verify=True)).files_sent == 0
    finally:
        await host.close()


# -- 10: stale upload temps ------------------------------------------------------------------------

def _config(tmp_path: Path, sshd: SSHD, src: Path, dst: Path) -> Path:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.h1]\nssh = "{sshd.target}"\nknown_hosts = "{sshd.known_hosts}"\n'
                   f'identity = "{sshd.user_key}"\npython = "{sys.executable}"\n'
                   f'root = "{tmp_path / "root"}"\n'
                   f'[sync.big]\nhost = "h1"\nlocal = "{src}"\nremote = "{dst}"\n')
    return cfg


async def test_killed_push_leaves_temp_that_next_push_removes(sshd: SSHD, tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    big = src / "big.bin"
    with open(big, "wb") as f:
        f.write(os.urandom(1 << 20) * 96)                   # 96 MiB: a few seconds over SFTP
    (src / "small.txt").write_text("small\n")
    cfg = _config(tmp_path, sshd, src, dst)
    proc = subprocess.Popen([sys.executable, "-m", "console", "--config", str(cfg), "push", "h1",
                             "big"], env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    temp: Path | None = None
    while time.monotonic() < deadline and proc.poll() is None:
        temps = [p for p in dst.glob(".big.bin.tmp-*")] if dst.exists() else []
        if temps and temps[0].stat().st_size > (1 << 20):
            temp = temps[0]
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)                          # the console dies mid-upload
    proc.wait()
    assert temp is not None, "the upload finished before it could be interrupted"
    time.sleep(0.2)                                          # sshd's sftp-server notices
    assert temp.exists() and not (dst / "big.bin").exists()
    # look-alikes that are not ours (or not provably abandoned) must stay
    lookalikes = [dst / ".big.bin.tmp-1a2b3c4d",                         # older versions
                  dst / ".notes.tmp-e3-user-file",
                  dst / f".x.tmp-e3-{'0' * 8}-{proc.pid}-1-0123abcd"]     # another machine
    if tempfiles.MACHINE == "0" * 8:
        lookalikes.pop()
    for p in lookalikes:
        p.write_text("user data\n")
    host = Host(ssh_host(sshd, tmp_path / "root"))
    try:
        trees = [await sync_tree(host, load_config(cfg).syncs["big"])]
        report = await push(host, trees)
        assert not temp.exists()
        assert report.trees[0].cleaned >= 1
        assert (dst / "big.bin").stat().st_size == big.stat().st_size
        for p in lookalikes:
            assert p.read_text() == "user data\n"
        assert (await push(host, trees)).files_sent == 0
    finally:
        await host.close()


async def test_dropped_link_mid_upload_temp_removed_by_same_process(sshd: SSHD,
                                                                  tmp_path: Path) -> None:
    """The console survives (a TUI): its own orphaned temp goes at its next push."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    with open(src / "big.bin", "wb") as f:
        f.write(os.urandom(1 << 20) * 96)
    host = Host(ssh_host(sshd, tmp_path / "root"))
    tree = Tree("work", src, str(dst))
    try:
        task = asyncio.ensure_future(push(host, [tree]))
        orphan: Path | None = None
        for _ in range(6000):
            temps = list(dst.glob(".big.bin.tmp-*")) if dst.exists() else []
            if temps and temps[0].stat().st_size > (1 << 20):
                orphan = temps[0]
                break
            if task.done():
                break
            await asyncio.sleep(0.01)
        assert orphan is not None, "the upload finished before it could be interrupted"
        sshd.drop_connections()
        with contextlib.suppress(Unreachable):
            await task                       # failed, or retried on a new link: either way
        assert orphan.exists()
        report = await push(host, [tree])
        assert not orphan.exists() and report.trees[0].cleaned >= 1
        assert [p.name for p in dst.iterdir()] == ["big.bin"]
        assert (dst / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
    finally:
        await host.close()


def test_stale_judgement_needs_our_shape_machine_and_a_gone_owner() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ours_dead = f".f.tmp-e3-{tempfiles.MACHINE}-{dead.pid}-{int(time.time())}-0123abcd"
    assert tempfiles.is_stale(ours_dead)
    live = tempfiles.temp_name("/x/f")
    assert tempfiles.is_ours(os.path.basename(live))
    assert not tempfiles.is_stale(os.path.basename(live))          # this process: alive
    parent = f".f.tmp-e3-{tempfiles.MACHINE}-{os.getppid()}-1-0123abcd"   # PID reused: stale
    assert tempfiles.is_stale(parent)
    for name in (".f.tmp-0123abcd", ".f.tmp-e3-zz", "f.tmp-e3-x"):
        assert not tempfiles.is_stale(name)


# -- 15: a full disk ---------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    mnt = tmp_path / "small disk"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip() or 'not root'})")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("kind", ["local", "ssh"])
async def test_full_disk_says_no_space(kind: str, small_disk: Path, tmp_path: Path,
                                       request: pytest.FixtureRequest) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(3 << 20))      # 3 MiB onto a 1 MiB disk
    root = tmp_path / "root"
    cfg = (ssh_host(request.getfixturevalue("sshd"), root) if kind == "ssh"
           else HostConfig(name="h1", ssh=None, python=sys.executable, root=str(root)))
    host = Host(cfg)
    dst = small_disk / "dst"
    try:
        with pytest.raises(CommandFailed) as e:
            await push(host, [Tree("work", src, str(dst))])
        msg = str(e.value)
        assert f"no space left on h1:{dst}" in msg and "\n" not in msg
        assert [p.name for p in dst.iterdir()] == []          # no partial file left
    finally:
        await host.close()
