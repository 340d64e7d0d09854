"""Transports: how the console reaches a host. `open_transport(host)` picks local or SSH."""

from __future__ import annotations

from typing import TYPE_CHECKING

from console.transport.base import CommandResult, FileStat, Transport, command_line, quote

if TYPE_CHECKING:
    from console.settings.config import HostConfig

__all__ = ["CommandResult", "FileStat", "Transport", "command_line", "quote", "open_transport"]


def open_transport(host: HostConfig) -> Transport:
    """The transport for a configured host (not yet connected)."""
    if host.ssh is None:
        from console.transport.local import LocalTransport
        return LocalTransport(host.name)
    from console.transport.ssh import SSHTransport
    return SSHTransport(host.name, host.ssh, known_hosts=host.known_hosts,
                        ssh_config=host.ssh_config, identity=host.identity)
