"""`eagle3-console trust HOST [--yes]`: record a host's SSH key after the user has checked it.

The console never trusts a host key silently: an unknown host is refused with its fingerprint
and a pointer here. This fetches the key the host presents, shows its SHA256 fingerprint and
appends it to the host's known_hosts file only when the user confirms (or passes --yes). A host
whose recorded key differs is refused outright: a changed key is fixed by hand, never here.
ProxyJump hops are dialled by the SSH transport's own code, so they are verified against the
same known_hosts files as every connection of the host.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

import asyncssh

import console.transport.known_hosts as kh
from console.errors import ConfigError, HostKeyChanged, HostKeyTypeMismatch, Unreachable
from console.settings.config import Config, HostConfig
from console.transport.ssh import SSHTransport

HELP = "show HOST's SSH host key fingerprint and add it to known_hosts once you confirm"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("host",
                   help="a configured host name, or an ssh target (alias or user@host[:port])")
    p.add_argument("--yes", "-y", action="store_true",
                   help="record the key without asking (only after checking the fingerprint)")


def _host(config: Config, name: str) -> HostConfig:
    if name in config.hosts:
        return config.hosts[name]
    if "@" in name or "." in name or ":" in name:
        return HostConfig(name=name, ssh=name)
    return config.host(name)  # raises ConfigError listing the configured hosts


async def run(args: argparse.Namespace, config: Config) -> int:
    host = _host(config, args.host)
    if host.ssh is None:
        raise ConfigError(f"host {host.name!r} is this machine (no ssh): there is no key to trust")
    # hops are dialled by the transport's own code: verified against the same known_hosts as
    # any connection of this host, errors naming the hop (never asyncssh's defaults)
    transport = SSHTransport(host.name, host.ssh, known_hosts=host.known_hosts,
                             ssh_config=host.ssh_config, identity=host.identity)
    try:
        target, resolved, via = await transport.open_jumps()
        return await _trust(args, host, target, resolved, via)
    finally:
        await transport.close()


async def _trust(args: argparse.Namespace, host: HostConfig, target: kh.Target,
                 resolved: kh.Resolved, via: asyncssh.SSHClientConnection | None) -> int:
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
            config=kh.config_arg(host.ssh_config), server_host_key_algs=algs, tunnel=via), 20)

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
    if verdict == "trusted":
        print(f"{host.name}: {fp} is already trusted ({file})")
        return 0
    print(f"{host.name}: {resolved.host} port {port} presents the host key\n  {fp}\n"
          f"Compare it with the server's own (`ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub` there).")
    if not args.yes:
        print(f"Trust this key and add it to {file}? [y/N] ", end="", flush=True)
        answer = await asyncio.to_thread(sys.stdin.readline)
        if answer.strip().lower() not in ("y", "yes"):
            print("not trusted; nothing written")
            return 1
    kh.append_entry(file, kh.entry_line(name, resolved.key_port, key))
    print(f"added {name} to {file}")
    return 0
