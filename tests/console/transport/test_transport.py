"""Both transports against real processes: local subprocesses, and a real OpenSSH sshd on
127.0.0.1 (the `sshd` fixture). The sshd runs on this machine, so what a command did "remotely"
is checked directly on the filesystem and process table here, independently of the transport.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from console.errors import CommandFailed, NoSFTP, Unreachable
from console.settings.config import HostConfig
from console.transport import Transport, open_transport
from console.transport.ssh import SSHTransport
from tests.conftest import ssh_host
from tests.paths import REPO
from tests.sshd import SSHD, free_port, start_sshd

pytestmark = pytest.mark.timeout(60)

PY = sys.executable


def is_ssh(t: Transport) -> bool:
    return isinstance(t, SSHTransport)


def alive(pid: int) -> bool:
    """Still running (a zombie waiting for its reaper has already died)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def wait_gone(pids: list[int], within: float = 5.0) -> list[int]:
    """The pids still alive after `within` seconds."""
    deadline = time.monotonic() + within
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return left


def temps(folder: Path) -> list[str]:
    return [n for n in os.listdir(folder) if ".tmp-" in n]


# -- commands ---------------------------------------------------------------------------------

async def test_run_exit_code_stdout_stderr(transport: Transport) -> None:
    r = await transport.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (r.returncode, r.stdout, r.stderr) == (3, "out\n", "err\n")
    assert not r.ok
    with pytest.raises(CommandFailed) as e:
        await transport.run(["sh", "-c", "echo boom >&2; exit 4"], check=True)
    assert e.value.returncode == 4 and "boom" in str(e.value)
    ok = await transport.run(["true"], check=True)
    assert ok.ok and ok.stdout == ""


async def test_run_missing_program_is_127(transport: Transport) -> None:
    r = await transport.run(["eagle3-no-such-program"])
    assert r.returncode == 127


async def test_run_input_env_cwd(transport: Transport, tmp_path: Path) -> None:
    r = await transport.run(["cat"], input="line1\nline2\n")
    assert r.stdout == "line1\nline2\n"
    # a command that exits without reading its input is not an error
    assert (await transport.run(["head", "-c", "3"], input="y" * 2_000_000)).stdout == "yyy"
    r = await transport.run([PY, "-c", "import os; print(os.getcwd()); print(os.environ['E3_X'])"],
                            cwd=str(tmp_path), env={"E3_X": "forty two"}, check=True)
    assert r.stdout.splitlines() == [str(tmp_path), "forty two"]
    home = await transport.run(["pwd"], cwd="~", check=True)
    assert home.stdout.strip() == os.path.expanduser("~")
    script = await transport.run_script("x=$(echo hi); printf '%s-%s' \"$x\" \"$1\"", check=True)
    assert script.stdout == "hi-"


async def test_run_timeout_kills_the_process_group(transport: Transport, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    t0 = time.monotonic()
    with pytest.raises(CommandFailed, match="timed out"):
        await transport.run(["sh", "-c", f"sleep 30 & echo $! $$ > {pidfile}; wait"], timeout=1)
    assert time.monotonic() - t0 < 8
    pids = [int(p) for p in pidfile.read_text().split()]
    assert await wait_gone(pids) == []


async def test_stream_yields_lines_as_they_come(transport: Transport, tmp_path: Path) -> None:
    go = tmp_path / "go"
    script = f"echo first; while [ ! -e {go} ]; do sleep 0.02; done; echo second; echo third"
    lines = transport.stream(["sh", "-c", script])
    assert await asyncio.wait_for(lines.__anext__(), 10) == "first"
    # the process is still blocked waiting for `go`: the first line came while it ran
    assert not go.exists()
    go.touch()
    assert [x async for x in lines] == ["second", "third"]


async def test_stream_nonzero_exit_raises_after_last_line(transport: Transport) -> None:
    got: list[str] = []
    with pytest.raises(CommandFailed) as e:
        async for line in transport.stream(["sh", "-c", "echo a; echo b; echo bad >&2; exit 5"]):
            got.append(line)
    assert got == ["a", "b"]
    assert e.value.returncode == 5 and "bad" in str(e.value)


@pytest.mark.parametrize("how", ["aclose", "cancel"])
async def test_stream_cancel_kills_process_and_children(transport: Transport, how: str) -> None:
    lines = transport.stream(["sh", "-c", "sleep 60 & echo $!; echo $$; wait"])
    child = int(await lines.__anext__())
    shell = int(await lines.__anext__())
    assert alive(child) and alive(shell)
    if how == "aclose":
        await lines.aclose()
    else:
        async def consume() -> None:
            async for _ in lines:
                pass
        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert await wait_gone([child, shell]) == []


# -- files ------------------------------------------------------------------------------------

async def test_upload_content_mtime_and_parents(transport: Transport, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    a, b = src / "a.bin", src / "b.sh"
    a.write_bytes(os.urandom(300_000))
    b.write_text("#!/bin/sh\necho hi\n")
    b.chmod(0o755)
    os.utime(a, (1_600_000_000.25, 1_600_000_000.75))
    dst = tmp_path / "dst" / "deep" / "er"
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "old").write_text("old")
    sent = await transport.upload([(str(a), str(dst / "a.bin")), (str(b), str(dst / "b.sh")),
                                   (str(b), str(tmp_path / "dst" / "old"))])
    assert sent == a.stat().st_size + 2 * b.stat().st_size
    assert (dst / "a.bin").read_bytes() == a.read_bytes()
    assert (tmp_path / "dst" / "old").read_text() == b.read_text()  # replaced in place
    assert os.access(dst / "b.sh", os.X_OK)
    mtime = (dst / "a.bin").stat().st_mtime
    # SFTP (v3, OpenSSH) carries whole seconds; locally the mtime is exact
    assert mtime == (1_600_000_000 if is_ssh(transport) else 1_600_000_000.75)
    st = await transport.stat(str(dst / "a.bin"))
    assert st is not None and st.size == 300_000 and int(st.mtime) == 1_600_000_000
    assert temps(dst) == [] and temps(tmp_path / "dst") == []


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("big") / "big.bin"
    block = os.urandom(1 << 20)
    with open(p, "wb") as f:
        for _ in range(160):
            f.write(block)
    return p


async def test_cancelled_upload_leaves_nothing(transport: Transport, tmp_path: Path,
                                               big_file: Path) -> None:
    final = tmp_path / "out" / "big.bin"
    task = asyncio.ensure_future(transport.upload([(str(big_file), str(final))]))
    deadline = time.monotonic() + 20
    seen_temp = False
    while not task.done() and time.monotonic() < deadline:
        assert not final.exists()  # never a partial file under the final name
        if final.parent.exists() and any(
                (final.parent / n).stat().st_size > 0 for n in temps(final.parent)):
            seen_temp = True
            break
        await asyncio.sleep(0.0005)
    assert seen_temp, "the upload finished before it could be interrupted"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.1)
    assert not final.exists()
    assert temps(final.parent) == []


async def test_write_bytes_atomic_replace_and_mode(transport: Transport, tmp_path: Path) -> None:
    p = tmp_path / "sub" / "f.json"
    await transport.write_bytes(str(p), b'{"a": 1}')
    assert p.read_bytes() == b'{"a": 1}'
    inode = p.stat().st_ino
    await transport.write_bytes(str(p), b"\x00\xffsecond", mode=0o600)
    assert p.read_bytes() == b"\x00\xffsecond"
    assert p.stat().st_mode & 0o777 == 0o600
    assert p.stat().st_ino != inode  # a new file renamed over the old one, not rewritten
    assert temps(p.parent) == []


async def test_read_range(transport: Transport, tmp_path: Path) -> None:
    p = tmp_path / "r.bin"
    data = bytes(range(256)) * 1000
    p.write_bytes(data)
    assert await transport.read_range(str(p), 0, 10) == data[:10]
    assert await transport.read_range(str(p), 1000, 70_000) == data[1000:71_000]
    assert await transport.read_range(str(p), len(data) - 5, 100) == data[-5:]  # short at EOF
    assert await transport.read_range(str(p), len(data) + 10, 100) == b""
    with pytest.raises(CommandFailed):
        await transport.read_range(str(tmp_path / "missing"), 0, 1)


async def test_stat_and_remove(transport: Transport, tmp_path: Path) -> None:
    f = tmp_path / "f.txt"
    f.write_text("hello")
    st = await transport.stat(str(f))
    assert st is not None and st.size == 5 and not st.is_dir
    assert int(st.mtime) == int(f.stat().st_mtime)
    d = await transport.stat(str(tmp_path))
    assert d is not None and d.is_dir
    assert await transport.stat(str(tmp_path / "nope")) is None
    assert await transport.stat(str(f / "below-a-file")) is None
    home = await transport.stat("~")
    assert home is not None and home.is_dir
    await transport.remove([str(f), str(tmp_path / "nope")])
    assert not f.exists()
    assert await transport.stat(str(f)) is None


# -- SSH connection behaviour -----------------------------------------------------------------

async def test_ssh_reconnects_after_drop(sshd: SSHD) -> None:
    async with open_transport(ssh_host(sshd)) as t:
        assert (await t.run(["echo", "one"])).stdout == "one\n"
        assert sshd.drop_connections() >= 1
        # the next operation notices the dead link and reconnects transparently
        assert (await t.run(["echo", "two"], check=True)).stdout == "two\n"
        assert t.connected
        sshd.drop_connections()
        deadline = time.monotonic() + 5
        while t.connected and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert not t.connected
        assert await t.stat(str(sshd.known_hosts)) is not None  # SFTP reopens too


class Relay:
    """A TCP relay in front of sshd that can go away and come back on the same port, as a
    host does when its network blips or it reboots."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.server: asyncio.base_events.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.close()
        await self.server.wait_closed()

    async def _handle(self, r1: asyncio.StreamReader, w1: asyncio.StreamWriter) -> None:
        r2, w2 = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers += [w1, w2]

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                w.close()

        await asyncio.gather(pipe(r1, w2), pipe(r2, w1))


async def test_ssh_reconnects_with_backoff_while_host_is_away(sshd: SSHD, tmp_path: Path) -> None:
    relay = Relay(sshd.port)
    await relay.start()
    pub = " ".join(Path(str(sshd.host_key) + ".pub").read_text().split()[:2])
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{relay.port} {pub}\n")
    host = ssh_host(sshd, ssh=f"{sshd.user}@127.0.0.1:{relay.port}", known_hosts=str(known))
    async with open_transport(host) as t:
        assert (await t.run(["echo", "one"])).stdout == "one\n"
        await relay.stop()  # the link drops and the host refuses connections for a while
        deadline = time.monotonic() + 5
        while t.connected and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        t0 = time.monotonic()
        pending = asyncio.ensure_future(t.run(["echo", "two"]))
        await asyncio.sleep(0.8)  # a few refused tries
        assert not pending.done()
        await relay.start()
        assert (await asyncio.wait_for(pending, 15)).stdout == "two\n"
        assert 0.8 <= time.monotonic() - t0 < 10
    await relay.stop()


async def test_ssh_stream_in_flight_when_link_drops(sshd: SSHD) -> None:
    async with open_transport(ssh_host(sshd)) as t:
        lines = t.stream(["sh", "-c", "i=0; while true; do echo $i; i=$((i+1)); sleep 0.05; done"])
        assert await lines.__anext__() == "0"
        sshd.drop_connections()
        with pytest.raises(Unreachable):
            async for _ in lines:
                pass
        assert (await t.run(["echo", "back"])).stdout == "back\n"


async def test_ssh_config_alias(sshd: SSHD) -> None:
    # HostName, Port, User, IdentityFile and UserKnownHostsFile all come from the ssh_config
    host = HostConfig(name="t", ssh=sshd.alias, ssh_config=str(sshd.ssh_config))
    async with open_transport(host) as t:
        r = await t.run(["id", "-un"], check=True)
        assert r.stdout.strip() == sshd.user


async def test_ssh_unreachable_port(sshd: SSHD) -> None:
    port = free_port()  # nothing listens there
    t = open_transport(ssh_host(sshd, ssh=f"{sshd.user}@127.0.0.1:{port}"))
    t0 = time.monotonic()
    with pytest.raises(Unreachable) as e:
        await t.connect()
    assert time.monotonic() - t0 < 5
    assert e.value.__cause__ is not None and str(port) in str(e.value)
    with pytest.raises(Unreachable):
        await t.run(["true"])
    assert not t.connected


async def test_a_host_whose_sshd_offers_no_sftp_is_named_so(tmp_path: Path) -> None:
    """A real sshd started without its `Subsystem sftp` line: commands run, every file
    operation (and a subcommand that needs one) says what the host lacks and how to enable it,
    in one line; not `connection lost`."""
    own = start_sshd(tmp_path / "sshd", sftp=False)
    try:
        async with open_transport(ssh_host(own)) as t:
            assert (await t.run(["echo", "hi"], check=True)).stdout == "hi\n"
            for call in (lambda: t.stat(str(tmp_path)), lambda: t.write_bytes(
                    str(tmp_path / "x"), b"x"), lambda: t.read_range(str(tmp_path / "x"), 0, 1)):
                with pytest.raises(NoSFTP, match=r"^t: its sshd offers no SFTP subsystem, which "
                                                 r"the console needs for files \((stat|write|"
                                                 r"read) .*\); enable it in the host's "
                                                 r"sshd_config \(`Subsystem sftp internal-sftp`\)"
                                                 " and reload sshd$"):
                    await call()
            assert t.connected and not (tmp_path / "x").exists()
        config = tmp_path / "config.toml"
        config.write_text(f'[hosts.box]\nssh = "{own.target}"\n'
                          f'known_hosts = "{own.known_hosts}"\nidentity = "{own.user_key}"\n'
                          f'python = "{PY}"\nroot = {json.dumps(str(tmp_path / "root"))}\n')
        r = subprocess.run([PY, "-m", "console", "--config", str(config), "push", "box"],
                           cwd=REPO, capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert r.returncode == 1 and r.stdout == "", r
        assert r.stderr.startswith("error: box: its sshd offers no SFTP subsystem") \
            and r.stderr.count("\n") == 1 and "Subsystem sftp" in r.stderr, r.stderr
    finally:
        own.stop()
