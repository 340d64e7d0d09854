"""Host-key safety against a real sshd: unknown hosts and changed keys are refused (with the
fingerprint, computed here independently by ssh-keygen), hashed and `[host]:port` entries are
honoured, bad credentials are AuthFailed, and `eagle3-console trust` records a key only when
told to and never over a different one."""

from __future__ import annotations

import argparse
import io
import subprocess
from pathlib import Path

import pytest

import console.transport.known_hosts as kh
from console.cli import main
from console.commands import trust
from console.errors import AuthFailed, HostKeyChanged, HostKeyUnknown
from console.hosts.host import HostPool
from console.settings.config import load_config
from console.transport import open_transport
from tests.conftest import ssh_host
from tests.sshd import SSHD, keygen

pytestmark = pytest.mark.timeout(60)


def sha256_of(pubkey_file: Path) -> str:
    """SHA256:... as OpenSSH's own ssh-keygen prints it."""
    out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(pubkey_file)],
                         capture_output=True, text=True, check=True).stdout
    return out.split()[1]


def host_pub(sshd: SSHD) -> str:
    return " ".join(Path(str(sshd.host_key) + ".pub").read_text().split()[:2])


def other_key(tmp_path: Path) -> str:
    return " ".join(keygen(tmp_path / "other_host", "other").split()[:2])


async def test_unknown_host_refused_with_fingerprint(sshd: SSHD, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    for kh_file in (empty, tmp_path / "missing_known_hosts"):
        t = open_transport(ssh_host(sshd, known_hosts=str(kh_file)))
        with pytest.raises(HostKeyUnknown) as e:
            await t.connect()
        fp = sha256_of(Path(str(sshd.host_key) + ".pub"))
        assert fp in str(e.value) and e.value.fingerprint.endswith(fp)
        assert "eagle3-console trust t" in str(e.value)
        assert e.value.__cause__ is not None
        assert not t.connected
    assert empty.read_text() == ""  # nothing trusted behind our back


async def test_changed_key_refused(sshd: SSHD, tmp_path: Path) -> None:
    kh_file = tmp_path / "known_hosts"
    kh_file.write_text(f"[127.0.0.1]:{sshd.port} {other_key(tmp_path)}\n")
    t = open_transport(ssh_host(sshd, known_hosts=str(kh_file)))
    with pytest.raises(HostKeyChanged) as e:
        await t.connect()
    assert sha256_of(Path(str(sshd.host_key) + ".pub")) in str(e.value)
    assert str(kh_file) in str(e.value)
    with pytest.raises(HostKeyChanged):  # every later try too
        await t.run(["true"])


async def test_hashed_entries_are_matched(sshd: SSHD, tmp_path: Path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text(f"[127.0.0.1]:{sshd.port} {host_pub(sshd)}\n")
    bad.write_text(f"[127.0.0.1]:{sshd.port} {other_key(tmp_path)}\n")
    for f in (good, bad):
        subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(f)], check=True, capture_output=True)
        assert f.read_text().startswith("|1|")
    async with open_transport(ssh_host(sshd, known_hosts=str(good))) as t:
        assert (await t.run(["echo", "ok"])).stdout == "ok\n"
    with pytest.raises(HostKeyChanged):
        await open_transport(ssh_host(sshd, known_hosts=str(bad))).connect()


async def test_wrong_identity_is_auth_failed(sshd: SSHD, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)  # no agent offering other keys
    keygen(tmp_path / "stranger", "stranger")
    t = open_transport(ssh_host(sshd, identity=str(tmp_path / "stranger")))
    with pytest.raises(AuthFailed) as e:
        await t.connect()
    assert e.value.__cause__ is not None
    with pytest.raises(AuthFailed, match="missing or unreadable"):
        await open_transport(ssh_host(sshd, identity=str(tmp_path / "nope"))).connect()


def test_parse_target() -> None:
    assert kh.parse_target("gpu1") == kh.Target("gpu1")
    assert kh.parse_target("root@10.0.0.5") == kh.Target("10.0.0.5", None, "root")
    assert kh.parse_target("root@10.0.0.5:2222") == kh.Target("10.0.0.5", 2222, "root")
    assert kh.parse_target("me@[::1]:22") == kh.Target("::1", 22, "me")
    assert kh.parse_target("fe80::1") == kh.Target("fe80::1")
    for bad in ("a b", "x@y:99999", "@host", ""):
        with pytest.raises(ValueError):
            kh.parse_target(bad)


# -- eagle3-console trust ---------------------------------------------------------------------

def write_config(tmp_path: Path, sshd: SSHD, kh_file: Path) -> Path:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.t]\nssh = "{sshd.target}"\nknown_hosts = "{kh_file}"\n'
                   f'identity = "{sshd.user_key}"\n')
    return cfg


def test_trust_asks_and_records_only_on_yes(sshd: SSHD, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    kh_file = tmp_path / "ssh" / "known_hosts"  # parent missing too
    cfg = write_config(tmp_path, sshd, kh_file)
    fp = sha256_of(Path(str(sshd.host_key) + ".pub"))

    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    assert main(["--config", str(cfg), "trust", "t"]) == 1
    out = capsys.readouterr().out
    assert fp in out and "nothing written" in out
    assert not kh_file.exists()

    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    assert main(["--config", str(cfg), "trust", "t"]) == 0
    assert kh_file.read_text() == f"[127.0.0.1]:{sshd.port} {host_pub(sshd)}\n"
    assert kh_file.stat().st_mode & 0o777 == 0o600

    # now the transport connects, and trusting again changes nothing
    r = subprocess.run(["ssh", "-o", f"UserKnownHostsFile={kh_file}", "-o", "BatchMode=yes",
                        "-o", "StrictHostKeyChecking=yes", "-i", str(sshd.user_key),
                        "-p", str(sshd.port), f"{sshd.user}@127.0.0.1", "echo", "via-openssh"],
                       capture_output=True, text=True, timeout=20)
    assert r.stdout.strip() == "via-openssh", r.stderr  # OpenSSH accepts what we wrote
    assert main(["--config", str(cfg), "trust", "t", "--yes"]) == 0
    assert "already trusted" in capsys.readouterr().out
    assert kh_file.read_text().count("\n") == 1


async def test_trusted_key_lets_the_transport_in(sshd: SSHD, tmp_path: Path) -> None:
    kh_file = tmp_path / "known_hosts"
    cfg = write_config(tmp_path, sshd, kh_file)
    config = load_config(cfg)
    async with HostPool(config) as pool:
        assert await trust.run(argparse.Namespace(host="t", yes=True), config, pool) == 0
    async with open_transport(ssh_host(sshd, known_hosts=str(kh_file))) as t:
        assert (await t.run(["echo", "in"])).stdout == "in\n"


def test_trust_refuses_a_different_recorded_key(sshd: SSHD, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    kh_file = tmp_path / "known_hosts"
    before = f"# mine\n[127.0.0.1]:{sshd.port} {other_key(tmp_path)}\n"
    kh_file.write_text(before)
    cfg = write_config(tmp_path, sshd, kh_file)
    assert main(["--config", str(cfg), "trust", "t", "--yes"]) == 1
    err = capsys.readouterr().err
    assert "HOST KEY CHANGED" in err and sha256_of(Path(str(sshd.host_key) + ".pub")) in err
    assert kh_file.read_text() == before


async def test_the_console_names_an_unknown_key_and_trusts_it_after_asking(
        sshd: SSHD, tmp_path: Path) -> None:
    """A host whose key is not in known_hosts read `✖ failed (retrying)` forever. Now the
    header says `unknown host key`, the GPU pane shows the fingerprint and what to press; `K`
    (also found by the palette) shows the key and asks: no writes nothing, yes records it and
    the host connects."""
    import sys

    from console.app import create_app
    from console.dialogs.confirm import ConfirmScreen
    from console.hosts.host import HostState
    from console.panes.gpu import GpuPane
    from console.settings.config import Config
    from console.ui.palette import ConsoleCommands
    from console.widgets.gpu_table import GpuTable
    from console.widgets.status_line import StatusLine
    from tests.waiting import wait_for

    known = tmp_path / "known_hosts"
    known.write_text("")
    fp = sha256_of(Path(str(sshd.host_key) + ".pub"))
    host = ssh_host(sshd, name="gpu1", known_hosts=str(known), python=sys.executable,
                    root=str(tmp_path / "root"))
    app = create_app(Config(hosts={"gpu1": host}))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.pool.state["gpu1"] is HostState.FAILED, 30, "failed")
        await wait_for(pilot, lambda: app.screen.sub_title == "gpu1 ✖ unknown host key", 30,
                       "the header's host state")
        pane = app.screen.query_one(GpuPane)
        pane.refresh_view(force=True)
        status = pane.query_one(StatusLine).plain
        assert "✖ unknown host key" in status and fp in status and "retrying" not in status
        table = "\n".join(app.screen.query_one(GpuTable).plain_lines())
        assert fp in table and "K (or ctrl+p: Trust host key)" in table, table
        names = [name for name, _help, _run in ConsoleCommands(app.screen).commands()]
        assert "Trust host key" in names
        await pilot.press("K")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30, "the question")
        asked = str(app.screen.question)
        assert fp in asked and str(known) in asked and "presents the host key" in asked
        await pilot.press("n")
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen), 30, "the answer")
        assert known.read_text() == ""              # no: nothing written
        await pilot.press("K")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 30, "the question")
        await pilot.press("y")
        await wait_for(pilot, lambda: app.pool.state["gpu1"] is HostState.CONNECTED, 30,
                       "the connection")
        assert f"[127.0.0.1]:{sshd.port} {host_pub(sshd)}" in known.read_text()
        await wait_for(pilot, lambda: "● connected" in app.screen.sub_title, 30, "the header")
