"""Host keys: which known_hosts files verify a host, what they record for it, and trusting a key.

Verification is strict everywhere: a key is accepted only when a known_hosts entry for the host
records it. These helpers let the SSH transport tell an unknown host (no entry: show the
fingerprint and how to trust it) from a changed key (an entry with another key: always refused),
and let `eagle3-console trust HOST` record a key the user has checked.

Matching is asyncssh's own (exact names, `[host]:port` for non-default ports, patterns and
hashed `|1|...` entries), so what `trust` writes is exactly what a later connection looks up.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import asyncssh

from console.settings.safe_write import write_atomic

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
DEFAULT_SSH_PORT = 22

Verdict = Literal["trusted", "unknown", "changed"]


@dataclass(frozen=True)
class Target:
    """A host's `ssh` setting split up: an ssh_config alias or `user@host[:port]`."""

    host: str
    port: int | None = None
    username: str | None = None


_TARGET = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^@\s:]+))"
                     r"(?::(?P<port>\d{1,5}))?$")


def parse_target(ssh: str) -> Target:
    """`gpu1`, `root@10.0.0.5`, `root@10.0.0.5:2222`, `user@[::1]:22` or a bare IPv6 address."""
    s = ssh.strip()
    m = _TARGET.match(s)
    if m is None:
        user, _, rest = s.rpartition("@")
        if rest.count(":") >= 2 and "[" not in rest:  # bare IPv6, no port
            return Target(host=rest, username=user or None)
        raise ValueError(f"ssh target {ssh!r} is not an ssh_config alias or user@host[:port]")
    port = int(m["port"]) if m["port"] else None
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"ssh target {ssh!r}: port {port} out of range")
    return Target(host=m["v6"] or m["host"], port=port, username=m["user"])


def config_arg(ssh_config: str | None) -> list[str] | tuple[()]:
    """asyncssh's `config` argument: the given file, or () for its default (~/.ssh/config)."""
    return [os.path.expanduser(ssh_config)] if ssh_config else ()


@dataclass(frozen=True)
class Resolved:
    """Where a target really goes once ssh_config is applied."""

    host: str                 # HostName (or the name as given)
    port: int
    key_name: str             # HostKeyAlias if set, else host: the name known_hosts records
    config_known_hosts: tuple[str, ...]  # UserKnownHostsFile/GlobalKnownHostsFile from config
    ciphers_configured: bool = False     # ssh_config sets Ciphers: leave the choice to it
    proxy_jump: str | None = None        # ProxyJump hops, comma-separated (none: direct)
    key_alias: bool = False              # key_name is a HostKeyAlias (recorded without a port)

    @property
    def key_port(self) -> int | None:
        """The port a known_hosts entry names: none for a HostKeyAlias (as OpenSSH writes it)."""
        return None if self.key_alias else self.port


async def resolve(target: Target, ssh_config: str | None) -> Resolved:
    """Apply ssh_config (HostName, Port, HostKeyAlias, UserKnownHostsFile, ProxyJump) to a
    target."""
    opts = await asyncssh.SSHClientConnectionOptions.construct(
        None, config=config_arg(ssh_config), host=target.host,
        port=target.port if target.port is not None else (),
        username=target.username if target.username is not None else (),
        client_keys=None, agent_path=None)
    kh = opts.known_hosts
    files = tuple(os.path.expanduser(str(p)) for p in kh) if isinstance(kh, (list, tuple)) else ()
    jump = opts.config.get("ProxyJump")
    return Resolved(host=opts.host, port=int(opts.port), key_name=opts.host_key_alias or opts.host,
                    config_known_hosts=files,
                    ciphers_configured=opts.config.get("Ciphers") is not None,
                    proxy_jump=jump if isinstance(jump, str) and jump.lower() != "none" else None,
                    key_alias=bool(opts.host_key_alias))


def known_hosts_files(explicit: str | None, resolved: Resolved | None = None) -> list[Path]:
    """The files that verify a host: the configured one, else ssh_config's, else the default."""
    if explicit:
        return [Path(explicit).expanduser()]
    if resolved is not None and resolved.config_known_hosts:
        return [Path(p) for p in resolved.config_known_hosts]
    return [Path(DEFAULT_KNOWN_HOSTS).expanduser()]


def load(files: Sequence[Path]) -> asyncssh.SSHKnownHosts:
    """All entries of the files that exist (a missing file simply knows no host).
    A malformed file raises ValueError naming it."""
    known = asyncssh.SSHKnownHosts()
    for f in files:
        try:
            text = f.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            continue
        except OSError as e:
            raise ValueError(f"{f}: cannot read known_hosts: {e.strerror}") from e
        try:
            known.load(text)
        except ValueError as e:
            raise ValueError(f"{f}: {e}") from e
    return known


def fingerprint(key: asyncssh.SSHKey) -> str:
    """`ssh-ed25519 SHA256:...`, as `ssh-keygen -lf` and OpenSSH's prompts show it."""
    return f"{key.get_algorithm()} {key.get_fingerprint('sha256')}"


def _port_arg(port: int | None) -> int | None:
    # known_hosts writes the default port without brackets; asyncssh matches it as None
    return None if port in (None, DEFAULT_SSH_PORT) else port


def recorded(known: asyncssh.SSHKnownHosts, name: str, addr: str, port: int | None
             ) -> tuple[list[asyncssh.SSHKey], bool, list[asyncssh.SSHKey]]:
    """(host keys recorded for the host, whether a CA is trusted for it, revoked keys)."""
    host_keys, ca_keys, revoked, x509_certs, _rc, x509_subjects, _rs = known.match(
        name, addr, _port_arg(port))
    return list(host_keys), bool(ca_keys or x509_certs or x509_subjects), list(revoked)


def verdict(known: asyncssh.SSHKnownHosts, name: str, addr: str, port: int | None,
            key: asyncssh.SSHKey) -> Verdict:
    """Is key recorded for the host ('trusted'), is the host absent ('unknown'), or does the
    file record something else for it ('changed')?"""
    keys, has_ca, revoked = recorded(known, name, addr, port)
    if key in revoked:
        return "changed"
    if key in keys:
        return "trusted"
    return "changed" if keys or has_ca else "unknown"


def entry_line(name: str, port: int | None, key: asyncssh.SSHKey) -> str:
    """The known_hosts line recording key for name (and a non-default port)."""
    p = _port_arg(port)
    host = f"[{name}]:{p}" if p else name
    alg, b64 = key.export_public_key("openssh").decode().split()[:2]  # drop the comment
    return f"{host} {alg} {b64}"


def append_entry(path: Path, line: str) -> None:
    """Add line to a known_hosts file without ever leaving it half-written (temp, then rename);
    creates ~/.ssh-style parents (0700) and the file (0600) when missing. A symlinked file
    (a dotfile repo) is written through to its target and stays a symlink."""
    try:
        old = path.read_bytes()
    except FileNotFoundError:
        old = b""
    if old and not old.endswith(b"\n"):
        old += b"\n"
    write_atomic(path, old + line.encode() + b"\n", new_mode=0o600, parent_mode=0o700)
