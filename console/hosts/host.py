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
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from console.errors import HostKeyUnknown, TransportError
from console.settings.config import Config, HostConfig
from console.transport import CommandResult, FileStat, Transport, open_transport


class HostState(enum.Enum):
    """Connection state shown in the hosts list."""

    IDLE = "idle"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    RECONNECTING = "reconnecting"
    FAILED = "failed"


#: a host that answered before and has said nothing for this long reads "no answer for N s"
#: (its monitor sends a sample every second or two)
SILENT_S = 5.0


@dataclass(frozen=True)
class HostView:
    """What the header, the hosts list and the panes say about a host: its state and, when it
    has answered before and has been silent for SILENT_S, for how long (`silent_s`)."""

    state: HostState
    silent_s: float | None
    detail: str
    #: failed because its key is not in known_hosts: the key's fingerprint (`K` trusts it)
    unknown_key: str | None = None


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
    (the app's hosts list). `async with HostPool(config) as pool:` closes what it opened.

    The one place a host's state is kept: the connection (`ensure`), the monitor's stream
    (console/monitor/service.py) and the time of the host's last answer (`heard`) meet here,
    and `view` is what every widget shows."""

    def __init__(self, config: Config,
                 on_state: Callable[[str, HostState, str], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.hosts = {name: Host(cfg) for name, cfg in config.hosts.items()}
        self.state = {name: HostState.IDLE for name in config.hosts}
        self.detail = {name: "" for name in config.hosts}
        self.answered: dict[str, float | None] = {name: None for name in config.hosts}
        self.unknown_key: dict[str, str | None] = {name: None for name in config.hosts}
        self.connected_once: set[str] = set()   # hosts connected since the pool began
        self.on_state = on_state
        self.clock = clock

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

    def heard(self, name: str, t: float | None = None) -> None:
        """The host answered (a monitor sample, a connection made) at t (default: now). Only
        a host whose monitor has sent a sample is expected to answer all the time: one that
        was only connected (a stop, a launch) never reads "no answer"."""
        self.answered[name] = self.clock() if t is None else t

    def view(self, name: str) -> HostView:
        """The host's state, and how long it has been silent when that is over SILENT_S."""
        state, t = self.state.get(name, HostState.IDLE), self.answered.get(name)
        age = None if t is None else self.clock() - t
        silent = age if age is not None and age >= SILENT_S and state in (
            HostState.CONNECTED, HostState.RECONNECTING, HostState.FAILED) else None
        key = self.unknown_key.get(name) if state is HostState.FAILED else None
        return HostView(state, silent, self.detail.get(name, ""), key)

    async def ensure(self, name: str) -> Host:
        """Connected host, or raise after setting FAILED with the reason. A host the monitor
        found silent stays RECONNECTING while its link is still up: its next sample, not this,
        says it answers again (a frozen host's link stays up for a minute)."""
        host = self[name]
        if host.transport.connected:
            self.connected_once.add(name)
            if self.state[name] in (HostState.IDLE, HostState.CONNECTING, HostState.FAILED):
                self.set_state(name, HostState.CONNECTED)  # local: connected from the start
            return host
        # a host this console had connected before is reconnecting, however many tries failed
        # in between (it read `connecting` after the first failed one)
        self.set_state(name, HostState.RECONNECTING if name in self.connected_once
                       else HostState.CONNECTING)
        try:
            await host.connect()
        except TransportError as e:
            self.unknown_key[name] = e.fingerprint if isinstance(e, HostKeyUnknown) else None
            self.set_state(name, HostState.FAILED, str(e))
            raise
        self.unknown_key[name] = None
        self.connected_once.add(name)
        if self.answered[name] is not None:   # monitored (console/monitor): this answered too
            self.heard(name)
        self.set_state(name, HostState.CONNECTED)
        return host

    async def close(self) -> None:
        await asyncio.gather(*(h.close() for h in self.hosts.values()), return_exceptions=True)


async def stream_lines(host: Host, argv: Sequence[str]) -> AsyncIterator[str]:
    await host.connect()
    async for line in host.transport.stream(argv):
        yield line

