"""The host service: one configured host and its transport (connection, paths, commands), and
the pool that holds them.

`HostPool` is the one way to hold hosts: the app's (its state callback feeds the hosts list),
each subcommand's, and every service that acts on several hosts (launch, find, stop, serve) is
handed one and connects through `ensure`, so what the hosts list says stays true whoever
connected. Panes and subcommands call this; it never touches widgets. What runs the engine on a host
(push it when needed, `python -m engine ... --events`, doctor) sits above push, in
console/hosts/engine_client.py.
"""

from __future__ import annotations

import asyncio
import enum
import posixpath
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from console.errors import TransportError
from console.settings.config import Config, HostConfig
from console.transport import CommandResult, FileStat, Transport, open_transport


class HostState(enum.Enum):
    """Connection state shown in the hosts list."""

    IDLE = "idle"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    RECONNECTING = "reconnecting"
    FAILED = "failed"


class Host:
    """A configured host plus its (lazily opened) connection."""

    def __init__(self, cfg: HostConfig, transport: Transport | None = None) -> None:
        self.cfg = cfg
        self.transport = transport or open_transport(cfg)
        self._home: str | None = None
        self._lock = asyncio.Lock()
        self.engine_pushed = False  # set once this console's engine is known to be on the host

    @property
    def name(self) -> str:
        return self.cfg.name

    async def connect(self) -> None:
        async with self._lock:
            if not self.transport.connected:
                await self.transport.connect()

    async def close(self) -> None:
        await self.transport.close()

    # -- paths ---------------------------------------------------------------------------------
    async def home(self) -> str:
        if self._home is None:
            res = await self.transport.run_script('printf %s "$HOME"', check=True)
            self._home = res.stdout.strip() or "/"
        return self._home

    async def resolve(self, path: str) -> str:
        """Expand a leading ~ the way the host's shell would (quoting disables the shell's)."""
        if path == "~" or path.startswith("~/"):
            return posixpath.join(await self.home(), path[2:]) if path != "~" else await self.home()
        return path

    async def root(self) -> str:
        return await self.resolve(self.cfg.root)

    async def code_dir(self) -> str:
        """Where `push` puts the engine package (first on the engine's PYTHONPATH)."""
        return posixpath.join(await self.root(), "code")

    async def run(self, argv: Sequence[str], **kw: Any) -> CommandResult:
        await self.connect()
        return await self.transport.run(argv, **kw)

    async def stat(self, path: str) -> FileStat | None:
        """The host file's size, mtime and kind; None when there is nothing at path."""
        await self.connect()
        return await self.transport.stat(path)


class HostPool:
    """Every configured host, connected on demand (`ensure`), with an optional state callback
    (the app's hosts list). `async with HostPool(config) as pool:` closes what it opened."""

    def __init__(self, config: Config,
                 on_state: Callable[[str, HostState, str], None] | None = None) -> None:
        self.config = config
        self.hosts = {name: Host(cfg) for name, cfg in config.hosts.items()}
        self.state = {name: HostState.IDLE for name in config.hosts}
        self.detail = {name: "" for name in config.hosts}
        self.on_state = on_state

    def __getitem__(self, name: str) -> Host:
        """The host, not connected yet; ConfigError naming the configured ones if unknown."""
        if name not in self.hosts:
            self.config.host(name)   # raises: unknown host (configured: ...)
        return self.hosts[name]

    async def __aenter__(self) -> HostPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def set_state(self, name: str, state: HostState, detail: str = "") -> None:
        self.state[name], self.detail[name] = state, detail
        if self.on_state is not None:
            self.on_state(name, state, detail)

    async def ensure(self, name: str) -> Host:
        """Connected host, or raise after setting FAILED with the reason."""
        host = self[name]
        if host.transport.connected:
            if self.state[name] is not HostState.CONNECTED:  # local: connected from the start
                self.set_state(name, HostState.CONNECTED)
            return host
        was = self.state[name]
        self.set_state(name, HostState.RECONNECTING if was is HostState.CONNECTED
                       else HostState.CONNECTING)
        try:
            await host.connect()
        except TransportError as e:
            self.set_state(name, HostState.FAILED, str(e))
            raise
        self.set_state(name, HostState.CONNECTED)
        return host

    async def close(self) -> None:
        await asyncio.gather(*(h.close() for h in self.hosts.values()), return_exceptions=True)


async def stream_lines(host: Host, argv: Sequence[str]) -> AsyncIterator[str]:
    await host.connect()
    async for line in host.transport.stream(argv):
        yield line

