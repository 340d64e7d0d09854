"""Host-key failures of an SSH dial as the console's errors.

When asyncssh refuses a host (or jump host) key, the key the server presented is judged against
the known_hosts files (console/transport/known_hosts.py): no entry gives HostKeyUnknown, another
key gives HostKeyChanged, a server offering none of the recorded key types gives
HostKeyTypeMismatch. Each names the presented key's fingerprint and how to record a key the user
has checked (`eagle3-console trust HOST`, or `ssh SPEC` for a jump host).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass

import asyncssh

import console.transport.known_hosts as kh
from console.errors import (
    HostKeyChanged,
    HostKeyTypeMismatch,
    HostKeyUnknown,
    TransportError,
    Unreachable,
)

#: what asyncssh's client asked about and refused: (host, addr, port, key)
Refused = tuple[str, str, int, asyncssh.SSHKey]


@dataclass(frozen=True)
class Peer:
    """The host or jump host being dialled, as the host-key checks need it."""

    host: str                               # the configured host (what `trust` takes)
    who: str                                # the name errors carry: host, or host + hop
    spec: str                               # what was dialled (alias or user@host[:port])
    resolved: kh.Resolved
    known: asyncssh.SSHKnownHosts
    files: Sequence[os.PathLike[str]]       # the known_hosts files that verify it
    via: asyncssh.SSHClientConnection | None  # the hop it is reached through
    ssh_config: str | None
    timeout: float

    @property
    def is_hop(self) -> bool:
        return self.who != self.host

    async def server_key(self) -> asyncssh.SSHKey | None:
        """The host key the server presents (asyncssh's own errors propagate)."""
        return await asyncssh.get_server_host_key(
            self.resolved.host, self.resolved.port, config=kh.config_arg(self.ssh_config),
            tunnel=self.via)


async def refused_key_error(peer: Peer, refused: Refused | None) -> TransportError:
    """Unknown host or changed key? Judge the key the server presented against the file."""
    file = str(peer.files[0])
    if refused is not None:
        name, addr, port, key = refused
    else:
        # refused before asking us (a revoked key, a certificate): fetch the key to name it
        try:
            fetched = await peer.server_key()
        except (OSError, asyncio.TimeoutError, asyncssh.Error) as e:
            return Unreachable(peer.who, f"host key not accepted and not readable: {e}")
        if fetched is None:
            return HostKeyChanged(peer.who, "(no key presented)", file)
        key = fetched
        name, addr, port = peer.resolved.key_name, "", peer.resolved.port
    fp = kh.fingerprint(key)
    if kh.verdict(peer.known, name, addr, port, key) == "unknown":
        how = (f"record it with `ssh {peer.spec}` (OpenSSH asks) or `eagle3-console trust` on a "
               f"host entry for {peer.spec}" if peer.is_hop else
               f"trust it with `eagle3-console trust {peer.host}`")
        return HostKeyUnknown(peer.who, fp, f"if that is the server's key, {how} (adds it to "
                                            f"{file})")
    return HostKeyChanged(peer.who, fp, file)


async def key_type_mismatch(peer: Peer) -> HostKeyTypeMismatch | None:
    """When known_hosts records keys for the host and the server presents a key of none of
    their types, the error that says so (None when that is not what happened: asyncssh offers
    only the recorded key types, and a server with none of them hangs up during key exchange,
    which looks like a dropped link)."""
    keys, has_ca, _ = kh.recorded(peer.known, peer.resolved.key_name, "", peer.resolved.port)
    if not keys or has_ca:
        return None
    try:
        key = await asyncio.wait_for(peer.server_key(), peer.timeout)
    except (OSError, asyncio.TimeoutError, asyncssh.Error):
        return None
    recorded = sorted({k.get_algorithm() for k in keys})
    if key is None or key.get_algorithm() in recorded:
        return None
    how = (f"record the new key with `ssh {peer.spec}` or `eagle3-console trust` on a host "
           f"entry for {peer.spec}" if peer.is_hop else
           f"run `eagle3-console trust {peer.host}`")
    return HostKeyTypeMismatch(peer.who, recorded, kh.fingerprint(key), str(peer.files[0]), how)
