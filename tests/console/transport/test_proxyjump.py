"""ProxyJump through a real sshd (it jumps to itself on 127.0.0.1): the hop is dialled by us and
verified against the same known_hosts file as the host, and a key problem names the hop."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from console.errors import HostKeyChanged, HostKeyUnknown, Unreachable
from console.transport.proxy_jump import MAX_JUMPS
from console.transport.ssh import SSHTransport
from tests.sshd import SSHD, keygen

pytestmark = pytest.mark.timeout(60)


def host_pub(sshd: SSHD) -> str:
    return " ".join(Path(str(sshd.host_key) + ".pub").read_text().split()[:2])


def setup(sshd: SSHD, tmp: Path, *, bastion_key: str | None, gpu_key: str | None,
          loop: bool = False) -> tuple[Path, Path]:
    """An ssh_config with `bastion` and `gpu` (ProxyJump bastion) on the test sshd, told apart
    in known_hosts by HostKeyAlias; the keys recorded for each (None: not recorded)."""
    known = tmp / "known_hosts"
    known.write_text("".join(f"{alias} {key}\n" for alias, key in
                             (("bastion-key", bastion_key), ("gpu-key", gpu_key)) if key))
    common = ["  HostName 127.0.0.1", f"  Port {sshd.port}", f"  User {sshd.user}",
              f"  IdentityFile {sshd.user_key}", "  IdentitiesOnly yes",
              f"  UserKnownHostsFile {known}"]
    cfg = tmp / "ssh_config"
    cfg.write_text("\n".join(
        ["Host bastion", *common, "  HostKeyAlias bastion-key",
         *(["  ProxyJump bastion"] if loop else []),
         "Host gpu", *common, "  HostKeyAlias gpu-key", "  ProxyJump bastion", ""]))
    return cfg, known


def transport(cfg: Path, known: Path) -> SSHTransport:
    return SSHTransport("gpu1", "gpu", ssh_config=str(cfg), known_hosts=str(known),
                        connect_timeout=10)


async def test_runs_commands_through_the_jump_host(sshd: SSHD, tmp_path: Path) -> None:
    key = host_pub(sshd)
    cfg, known = setup(sshd, tmp_path, bastion_key=key, gpu_key=key)
    for _ in range(50):  # an earlier test's connection may still be closing on the server
        if not sshd.children():
            break
        await asyncio.sleep(0.1)
    before = len(sshd.children())
    t = transport(cfg, known)
    async with t:
        r = await t.run(["echo", "through the bastion"])
        assert r.stdout.strip() == "through the bastion"
        assert len(sshd.children()) == before + 2   # the hop's connection and the tunnelled one
    for _ in range(50):
        if len(sshd.children()) == before:
            break
        await asyncio.sleep(0.1)
    assert len(sshd.children()) == before           # closing the host closes its hop too


async def test_unknown_jump_host_is_refused_and_named(sshd: SSHD, tmp_path: Path) -> None:
    cfg, known = setup(sshd, tmp_path, bastion_key=None, gpu_key=host_pub(sshd))
    with pytest.raises(HostKeyUnknown) as e:
        await transport(cfg, known).connect()
    assert "gpu1: jump host bastion: unknown host key ssh-ed25519 SHA256:" in str(e.value)
    assert str(known) in str(e.value)


async def test_changed_key_behind_a_trusted_jump_names_the_host(sshd: SSHD,
                                                                tmp_path: Path) -> None:
    other = " ".join(keygen(tmp_path / "other", "other").split()[:2])
    cfg, known = setup(sshd, tmp_path, bastion_key=host_pub(sshd), gpu_key=other)
    with pytest.raises(HostKeyChanged) as e:
        await transport(cfg, known).connect()
    assert str(e.value).startswith("gpu1: HOST KEY CHANGED")


async def test_a_jump_loop_in_ssh_config_fails_fast(sshd: SSHD, tmp_path: Path) -> None:
    key = host_pub(sshd)
    cfg, known = setup(sshd, tmp_path, bastion_key=key, gpu_key=key, loop=True)
    with pytest.raises(Unreachable, match=f"more than {MAX_JUMPS} hops"):
        await transport(cfg, known).connect()
