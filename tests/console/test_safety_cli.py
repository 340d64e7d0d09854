"""Console-side safety: remote commands are terminated (TERM, then KILL) and never
orphaned when a subcommand is interrupted or signalled; `trust` dials jump hosts exactly as
connections do; malformed events, closed pipes, directories, host-key type mismatches and
option-like paths each give one clear line, never a traceback; the config and known_hosts are
written through symlinks, atomically. Real sshd, real files, real `python -m console` processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from console.settings.config import load_config
from console.transport import local as local_transport
from console.transport import ssh as ssh_transport
from console.transport.local import LocalTransport
from console.transport.ssh import SSHTransport
from console.ui.themes import remember_theme
from tests.console_cli import console, console_env
from tests.drafters import write_drafter
from tests.runs_registry import write_run
from tests.sshd import SSHD
from tests.waiting import wait_until as wait_for

pytestmark = pytest.mark.timeout(90)



def sshd_config(tmp_path: Path, sshd: SSHD, python: str = sys.executable) -> Path:
    """A console config with host `h1` on the test sshd."""
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.h1]\nssh = "{sshd.target}"\npython = "{python}"\n'
                   f'root = "{tmp_path / "h1 root"}"\nknown_hosts = "{sshd.known_hosts}"\n'
                   f'identity = "{sshd.user_key}"\n')
    return cfg


# -- 14: config and known_hosts written through symlinks, atomically -----------------------

def test_theme_choice_writes_through_a_symlinked_config(tmp_path: Path) -> None:
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    target = dotfiles / "eagle3.toml"
    target.write_text('# mine\n[hosts.a]\nssh = "a"\n')
    target.chmod(0o640)
    link = tmp_path / "conf" / "config.toml"
    link.parent.mkdir()
    link.symlink_to(target)
    remember_theme(load_config(link), "eagle3-light")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == 'theme = "eagle3-light"\n# mine\n[hosts.a]\nssh = "a"\n'
    assert target.stat().st_mode & 0o777 == 0o640
    assert load_config(link).theme == "eagle3-light"
    assert sorted(p.name for p in dotfiles.iterdir()) == ["eagle3.toml"]  # no temp left
    assert sorted(p.name for p in link.parent.iterdir()) == ["config.toml"]


def test_trust_writes_through_a_symlinked_known_hosts(sshd: SSHD, tmp_path: Path) -> None:
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    target = dotfiles / "known_hosts"
    target.write_text("# my hosts\n")
    target.chmod(0o644)
    link = tmp_path / "ssh" / "known_hosts"
    link.parent.mkdir()
    link.symlink_to(Path("..") / "dotfiles" / "known_hosts")   # a relative link too
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.h1]\nssh = "{sshd.target}"\nknown_hosts = "{link}"\n')
    r = console(tmp_path, "--config", str(cfg), "trust", "h1", "--yes")
    assert r.returncode == 0, r.stderr
    assert link.is_symlink()
    host_pub = " ".join(Path(str(sshd.host_key) + ".pub").read_text().split()[:2])
    assert target.read_text() == f"# my hosts\n[127.0.0.1]:{sshd.port} {host_pub}\n"
    assert target.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in dotfiles.iterdir()) == ["known_hosts"]


# -- 15: closed stdout, a directory for logs -------------------------------------------------

@pytest.mark.parametrize("cmd", [["doctor", "local"], ["runs", "local"]])
def test_a_closed_stdout_ends_quietly(tmp_path: Path, cmd: list[str]) -> None:
    # `... | head` with head already gone: the reader of our stdout is closed before we write
    proc = subprocess.Popen([sys.executable, "-m", "console", *cmd], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=console_env(tmp_path), cwd=tmp_path)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    rc = proc.wait(60)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert rc == 128 + signal.SIGPIPE


def test_logs_of_a_directory_says_so(sshd: SSHD, tmp_path: Path) -> None:
    cfg = sshd_config(tmp_path, sshd)
    (tmp_path / "logdir").mkdir()
    r = console(tmp_path, "--config", str(cfg), "logs", "h1", str(tmp_path / "logdir"))
    assert r.returncode == 1
    assert r.stderr.strip() == f"error: h1: {tmp_path / 'logdir'}: is a directory (logs prints " \
                               "a file)"


# -- 12: follow skips malformed events, counted ----------------------------------------------

MALFORMED = [
    {"kind": "metric", "step": 1, "values": "notadict"},
    {"kind": "metric", "step": "x", "values": {"loss": 1.0}},
    {"kind": "progress", "done": "many", "total": 3},
    {"kind": "progress", "done": 1, "total": {"n": 3}},
    {"kind": "progress", "done": 1, "total": 3, "unit": ["it"]},
    {"kind": "log", "level": ["warn"], "msg": "x"},
    {"kind": "log", "level": "warning", "msg": {"a": 1}},
    {"kind": "error", "msg": None},
]


def test_follow_skips_malformed_events_with_a_count(tmp_path: Path) -> None:
    def ev(**kw: object) -> str:
        return json.dumps({"v": 1, "t": 1.0, "cmd": "train", **kw})

    lines = [ev(kind="progress", done=1, total=3, unit="step", desc="train"),
             *(ev(**bad) for bad in MALFORMED),
             ev(kind="metric", step=2, values={"loss": 0.5}),
             ev(kind="log", level="warning", msg="still here")]
    root = tmp_path / "root"
    write_run(root, "finetune-1", lines, status="succeeded", start=1.0, end=2.0, exit_code=0,
              train_json=False)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.local]\npython = "{sys.executable}"\nroot = "{root}"\n')
    r = console(tmp_path, "--config", str(cfg), "follow", "finetune-1")
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["[train] 1/3 step", "step 2/3  loss 0.500",
                                     "warning: still here"]
    assert r.stderr.count("-- skipped a malformed event at byte") == 5   # the first few named
    assert "metric: values is not an object" in r.stderr
    assert f"-- warning: skipped {len(MALFORMED)} malformed event lines" in r.stderr


# -- 16: `--` separates paths from options ---------------------------------------------------

def test_inspect_and_convert_take_option_like_paths_after_double_dash(tmp_path: Path) -> None:
    work = tmp_path / "work"
    write_drafter(work / "--help", style="eagle")
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.local]\npython = "{sys.executable}"\nroot = "{tmp_path / "root"}"\n')
    r = console(tmp_path, "--config", str(cfg), "inspect", "local", "--json", "--", "--help",
                cwd=work, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ok"] is True
    r = console(tmp_path, "--config", str(cfg), "convert", "local", "--to", "vllm", "--json",
                "--", "--help", "-out", cwd=work, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (work / "-out" / "config.json").is_file() and (work / "--help").is_dir()


# -- 10: cancelling a command sends SIGTERM first, so it can clean up ------------------------

TRAPS_TERM = ('trap \'echo cleaned > "$0"; exit 0\' TERM; echo ready; '
              'while :; do sleep 0.1; done')


@pytest.mark.parametrize("where", ["local", "ssh"])
async def test_cancelling_a_stream_lets_the_command_clean_up(sshd: SSHD, tmp_path: Path,
                                                             where: str) -> None:
    marker = tmp_path / "cleaned up"
    t = LocalTransport() if where == "local" else SSHTransport(
        "h1", sshd.target, known_hosts=str(sshd.known_hosts), identity=str(sshd.user_key))
    started = asyncio.Event()

    async def consume() -> None:
        async for line in t.stream(["sh", "-c", TRAPS_TERM, str(marker)]):
            if line == "ready":
                started.set()

    async with t:
        task = asyncio.ensure_future(consume())
        await asyncio.wait_for(started.wait(), 20)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert marker.read_text() == "cleaned\n"   # TERM reached it (a KILL cannot be trapped)


@pytest.mark.parametrize("where", ["local", "ssh"])
async def test_a_command_that_ignores_term_is_killed_after_the_grace(
        sshd: SSHD, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    monkeypatch.setattr(local_transport, "TERM_GRACE", 1.0)
    monkeypatch.setattr(ssh_transport, "TERM_GRACE", 1.0)
    t = LocalTransport() if where == "local" else SSHTransport(
        "h1", sshd.target, known_hosts=str(sshd.known_hosts), identity=str(sshd.user_key))
    script = "trap '' TERM; echo $$; while :; do sleep 0.1; done"
    pid: list[int] = []

    async def consume() -> None:
        async for line in t.stream(["sh", "-c", script]):
            pid.append(int(line))

    async with t:
        task = asyncio.ensure_future(consume())
        while not pid:
            await asyncio.sleep(0.05)
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    for _ in range(100):
        if not psutil.pid_exists(pid[0]) or \
                psutil.Process(pid[0]).status() == psutil.STATUS_ZOMBIE:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the command survived")
    assert time.monotonic() - t0 >= 0.9           # it had its grace period first


# -- 13: SIGTERM / SIGHUP of a subcommand terminates its remote command ----------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signalled_subcommand_leaves_no_remote_command_behind(sshd: SSHD, tmp_path: Path,
                                                                sig: signal.Signals) -> None:
    # the host's python: the real one, except that `engine doctor` blocks (a long remote
    # command, started over the real sshd) after writing its pid
    pidfile = tmp_path / "remote.pid"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\ncase "$*" in *"-m engine doctor"*)\n'
                    f'  echo $$ > "{pidfile}.tmp"; mv "{pidfile}.tmp" "{pidfile}"\n'
                    '  exec sleep 300;;\n'
                    f'esac\nexec "{sys.executable}" "$@"\n')
    fake.chmod(0o755)
    cfg = sshd_config(tmp_path, sshd, python=str(fake))
    proc = subprocess.Popen([sys.executable, "-m", "console", "--config", str(cfg), "doctor",
                             "h1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=console_env(tmp_path), cwd=tmp_path)
    remote: psutil.Process | None = None
    try:
        wait_for(lambda: pidfile.exists() or proc.poll() is not None, 60, "the remote command")
        assert proc.poll() is None, proc.communicate()[1].decode()
        remote = psutil.Process(int(pidfile.read_text()))
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        wait_for(lambda: not remote.is_running() or remote.status() == psutil.STATUS_ZOMBIE,
                 10, "the remote command to end")
        assert proc.returncode == 128 + sig, err.decode()
        assert b"Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
        if remote is not None and remote.is_running():
            remote.kill()                  # never leave a sleeper behind, even when failing


# -- 11: trust dials jump hosts exactly as connections do ------------------------------------

def jump_setup(sshd: SSHD, tmp_path: Path, jump_known_hosts: str, known_text: str) -> Path:
    """ssh_config: `gpu` behind `bastion` (both the test sshd, told apart by HostKeyAlias);
    the bastion's own UserKnownHostsFile is jump_known_hosts. The console host h1 is `gpu` with
    its known_hosts file (holding known_text). Returns the console config."""
    known = tmp_path / "known_hosts"
    known.write_text(known_text)
    common = ["  HostName 127.0.0.1", f"  Port {sshd.port}", f"  User {sshd.user}",
              f"  IdentityFile {sshd.user_key}", "  IdentitiesOnly yes"]
    ssh_cfg = tmp_path / "ssh_config"
    ssh_cfg.write_text("\n".join(
        ["Host bastion", *common, "  HostKeyAlias bastion-key",
         f"  UserKnownHostsFile {jump_known_hosts}",
         "Host gpu", *common, "  HostKeyAlias gpu-key", "  ProxyJump bastion", ""]))
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.h1]\nssh = "gpu"\nssh_config = "{ssh_cfg}"\nknown_hosts = "{known}"\n'
                   f'python = "{sys.executable}"\nroot = "{tmp_path / "root"}"\n')
    return cfg


def host_key_line(sshd: SSHD) -> str:
    return " ".join(Path(str(sshd.host_key) + ".pub").read_text().split()[:2])


def test_trust_verifies_the_jump_against_the_hosts_known_hosts(sshd: SSHD,
                                                               tmp_path: Path) -> None:
    # the bastion is trusted only in h1's configured file; its ssh_config file knows nothing
    (tmp_path / "elsewhere").write_text("")
    bastion = f"bastion-key {host_key_line(sshd)}\n"
    cfg = jump_setup(sshd, tmp_path, str(tmp_path / "elsewhere"), bastion)
    r = console(tmp_path, "--config", str(cfg), "trust", "h1", "--yes")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "known_hosts").read_text() == bastion + f"gpu-key {host_key_line(sshd)}\n"
    r = console(tmp_path, "--config", str(cfg), "trust", "h1", "--yes")   # found again
    assert r.returncode == 0 and "already trusted" in r.stdout, r.stderr
    r = console(tmp_path, "--config", str(cfg), "doctor", "h1", "--json")   # and it connects
    assert r.returncode == 0, r.stderr


def test_trust_never_goes_through_an_unverified_jump(sshd: SSHD, tmp_path: Path) -> None:
    cfg = jump_setup(sshd, tmp_path, "none", "")
    r = console(tmp_path, "--config", str(cfg), "trust", "h1", "--yes")
    assert r.returncode == 1
    assert r.stderr.startswith("error: h1: jump host bastion: unknown host key ssh-ed25519 "), \
        r.stderr
    assert (tmp_path / "known_hosts").read_text() == ""          # nothing recorded


# -- 15: a host-key type mismatch is a host-key problem, not a dropped link ------------------

def test_host_key_type_mismatch_is_named(sshd: SSHD, tmp_path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-f", str(tmp_path / "old")],
                   check=True)
    old = " ".join((tmp_path / "old.pub").read_text().split()[:2])
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {old}\n")   # the server serves only ed25519
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.h1]\nssh = "{sshd.target}"\nknown_hosts = "{known}"\n'
                   f'identity = "{sshd.user_key}"\n')
    for cmd in (["doctor", "h1"], ["trust", "h1", "--yes"]):
        r = console(tmp_path, "--config", str(cfg), *cmd)
        assert r.returncode == 1
        err = r.stderr.strip()
        assert err.startswith("error: h1: host key type mismatch: "), err
        assert "ecdsa-sha2-nistp256" in err and "ssh-ed25519 SHA256:" in err
        assert "`eagle3-console trust h1`" in err and str(known) in err
        assert len(err.splitlines()) == 1
    assert known.read_text() == f"[127.0.0.1]:{sshd.port} {old}\n"
