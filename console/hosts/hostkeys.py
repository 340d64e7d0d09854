"""Trusting a host's SSH key once the user has checked it: the `trust` subcommand and the TUI's
`K` (console/screens/main.py) both fetch the key here, show its fingerprint, ask, and only then
append it to the host's known_hosts.

The console never trusts a host key silently. `offered_key` dials the host the way connections
do (ProxyJump hops verified against the same known_hosts files) and judges the key it presents:
already trusted, unknown (`record` writes it, after the user said yes), or changed, which is
raised (HostKeyChanged: a changed key is fixed by hand, never here), as is a server offering none
of the recorded key types (HostKeyTypeMismatch).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncssh

import console.transport.known_hosts as kh
from console.errors import ConfigError, HostKeyChanged, HostKeyTypeMismatch, Unreachable
from console.settings.config import HostConfig
from console.transport.ssh import SSHTransport

FETCH_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class KeyOffer:
    """The key a host presents, judged against its known_hosts file."""

    host: str               # the configured host
    where: str              # what answered: `gpu1.internal port 22`
    fingerprint: str        # `ssh-ed25519 SHA256:...`
    file: Path              # the known_hosts file it would be added to
    trusted: bool           # already recorded there
    name: str               # the name known_hosts records it under
    entry: str              # the known_hosts line `record` appends

    def presents(self) -> str:
        """What the user checks before saying yes (the CLI prints it, the TUI asks with it)."""
        return (f"{self.host}: {self.where} presents the host key\n  {self.fingerprint}\n"
                f"Compare it with the server's own (`ssh-keygen -lf "
                f"/etc/ssh/ssh_host_*_key.pub` there).")


async def offered_key(host: HostConfig) -> KeyOffer:
    """Fetch and judge the key host presents; ConfigError for a host without ssh, Unreachable
    when no key could be read, HostKeyChanged / HostKeyTypeMismatch as the module says."""
    if host.ssh is None:
        raise ConfigError(f"host {host.name!r} is this machine (no ssh): there is no key to trust")
    transport = SSHTransport(host.name, host.ssh, known_hosts=host.known_hosts,
                             ssh_config=host.ssh_config, identity=host.identity)
    try:
        target, resolved, via = await transport.open_jumps()
        return await _judge(host, target, resolved, via)
    finally:
        await transport.close()


def record(offer: KeyOffer) -> None:
    """Append the offered key to its known_hosts file (atomically); only after a yes."""
    kh.append_entry(offer.file, offer.entry)


async def _judge(host: HostConfig, target: kh.Target, resolved: kh.Resolved,
                 via: asyncssh.SSHClientConnection | None) -> KeyOffer:
    try:
        files = kh.known_hosts_files(host.known_hosts, resolved)
        known = kh.load(files)
    except (OSError, ValueError) as e:
        raise ConfigError(f"host {host.name!r}: {e}") from e
    file = files[0]
    name, port = resolved.key_name, resolved.port
    keys, _has_ca, _revoked = kh.recorded(known, name, "", port)
    # ask for the recorded key types first, so a host that also has other key types is not
    # mistaken for one whose key changed (OpenSSH does the same)
    algs = [a.decode() for k in keys for a in k.sig_algorithms] or ()
    where = f"{resolved.host}:{port}"

    async def fetch(algs: Sequence[str] | tuple[()]) -> asyncssh.SSHKey | None:
        return await asyncio.wait_for(asyncssh.get_server_host_key(
            target.host, target.port if target.port is not None else (),
            config=kh.config_arg(host.ssh_config), server_host_key_algs=algs, tunnel=via),
            FETCH_TIMEOUT_S)

    try:
        try:
            key = await fetch(algs)
        except (OSError, asyncssh.Error):
            if not algs:
                raise
            # the server offers none of the recorded key types: say so, with what it offers
            other = await fetch(())
            if other is None:
                raise
            raise HostKeyTypeMismatch(
                host.name, sorted({k.get_algorithm() for k in keys}), kh.fingerprint(other),
                str(file), f"run `eagle3-console trust {host.name}`") from None
    except (OSError, asyncio.TimeoutError, asyncssh.Error) as e:
        raise Unreachable(host.name, f"cannot fetch the host key of {where}: "
                                     f"{getattr(e, 'reason', None) or e}") from e
    if key is None:
        raise Unreachable(host.name, f"{where} presented no host key")
    fp = kh.fingerprint(key)
    verdict = kh.verdict(known, name, "", port, key)
    if verdict == "changed":
        raise HostKeyChanged(host.name, fp, str(file))
    return KeyOffer(host.name, f"{resolved.host} port {port}", fp, file, verdict == "trusted",
                    name, kh.entry_line(name, resolved.key_port, key))
