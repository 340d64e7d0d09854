"""`eagle3-console trust HOST [--yes]`: record a host's SSH key after the user has checked it.

The console never trusts a host key silently: an unknown host is refused with its fingerprint
and a pointer here (or `K` in the console). This fetches the key the host presents, shows its
SHA256 fingerprint and appends it to the host's known_hosts file only when the user confirms
(or passes --yes). A host
whose recorded key differs is refused outright: a changed key is fixed by hand, never here.
ProxyJump hops are dialled by the SSH transport's own code, so they are verified against the
same known_hosts files as every connection of the host.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from console.hosts.host import HostPool
from console.hosts.hostkeys import offered_key, record
from console.settings.config import Config, HostConfig

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


async def run(args: argparse.Namespace, config: Config, pool: HostPool) -> int:
    # fetched and judged in console/hosts/hostkeys.py, which the TUI's K shares
    offer = await offered_key(_host(config, args.host))
    if offer.trusted:
        print(f"{offer.host}: {offer.fingerprint} is already trusted ({offer.file})")
        return 0
    print(offer.presents())
    if not args.yes:
        print(f"Trust this key and add it to {offer.file}? [y/N] ", end="", flush=True)
        answer = await asyncio.to_thread(sys.stdin.readline)
        if answer.strip().lower() not in ("y", "yes"):
            print("not trusted; nothing written")
            return 1
    record(offer)
    print(f"added {offer.name} to {offer.file}")
    return 0
