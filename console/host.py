"""The host service: one configured host, its transport, and the engine calls made on it.

Panes and subcommands call this; it never touches widgets. The engine is invoked as
`PYTHON -m engine ... --events` with PYTHONPATH=ROOT/code (where `push` puts the engine package),
so a host runs the code the console pushed to it; `ensure_engine` pushes it (only what changed)
before the first engine call a Host makes, so a fresh host just works.
"""

from __future__ import annotations

import asyncio
import enum
import posixpath
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from console.config import Config, HostConfig
from console.errors import CommandFailed, ConsoleError, TransportError
from console.transport import CommandResult, Transport, open_transport
from engine import events


class HostState(enum.Enum):
    """Connection state shown in the hosts list."""

    IDLE = "idle"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    RECONNECTING = "reconnecting"
    FAILED = "failed"


@dataclass
class EngineError(ConsoleError):
    """An engine command failed on a host: the engine's own one-line message."""

    host: str
    message: str

    def __str__(self) -> str:
        return f"{self.host}: {self.message}"


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

    # -- engine calls ----------------------------------------------------------------------------
    async def ensure_engine(self, force: bool = False) -> None:
        """Push the engine package and host helpers when they differ from this console's copy.

        Checked once per Host (an unchanged engine costs two small SFTP reads); force re-checks."""
        if self.engine_pushed and not force:
            return
        from console.push import engine_trees, push  # push imports this module
        await push(self, await engine_trees(self))
        self.engine_pushed = True

    async def engine_argv(self, args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
        """argv and env that run `python -m engine ARGS` with the pushed code first on the path."""
        env = {"PYTHONPATH": await self.code_dir(), "PYTHONUNBUFFERED": "1"}
        return [self.cfg.python, "-m", "engine", *args], env

    async def engine(self, args: Sequence[str], *, timeout: float | None = None,
                     on_event: Callable[[events.Event], None] | None = None,
                     env: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Run an engine command with --events; return its result data or raise EngineError.

        on_event sees every event (progress bars in panes) as it arrives; env is added to the
        command's environment (e.g. OMP_NUM_THREADS)."""
        await self.connect()
        await self.ensure_engine()
        args = list(args)
        # options before a `--` (after it every word is a positional, e.g. a path `-x`)
        cut = args.index("--") if "--" in args else len(args)
        argv, full_env = await self.engine_argv([*args[:cut], "--events", *args[cut:]])
        full_env.update(env or {})
        result: dict[str, Any] | None = None
        error: str | None = None
        try:
            async with asyncio.timeout(timeout):
                async for line in self.transport.stream(argv, env=full_env):
                    ev = events.parse(line)
                    if ev is None:
                        continue
                    if on_event is not None:
                        on_event(ev)
                    if ev.kind == "result":
                        result = ev.get("data", {})
                    elif ev.kind == "error":
                        error = ev.get("msg", "failed")
        except CommandFailed as e:
            raise EngineError(self.name, error or _engine_failure(e)) from e
        except TimeoutError as e:
            what = " ".join(args[:1])
            raise EngineError(self.name, f"engine {what} took over {timeout:.0f} s") from e
        if error is not None:
            raise EngineError(self.name, error)
        if result is None:
            raise EngineError(self.name, f"engine {' '.join(args[:1])} ended without a result")
        return result

    async def run(self, argv: Sequence[str], **kw: Any) -> CommandResult:
        await self.connect()
        return await self.transport.run(argv, **kw)

    async def doctor(self, path: str | None = None) -> dict[str, Any]:
        """The engine's doctor report for this host (free disk measured at the host's root)."""
        root = path or await self.root()
        await self.transport.run(["mkdir", "-p", root])
        return await self.engine(["doctor", "--path", root], timeout=120)


def _engine_failure(e: CommandFailed) -> str:
    text = e.stderr or ""
    if "No module named engine" in text:
        return "the engine is not on this host yet: run `eagle3-console push HOST`"
    if "No module named" in text:
        return "the host's Python lacks a package: " + text.strip().splitlines()[-1]
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else str(e)


class HostPool:
    """Every configured host, connected on demand, with a state callback for the UI."""

    def __init__(self, config: Config,
                 on_state: Callable[[str, HostState, str], None] | None = None) -> None:
        self.config = config
        self.hosts = {name: Host(cfg) for name, cfg in config.hosts.items()}
        self.state = {name: HostState.IDLE for name in config.hosts}
        self.detail = {name: "" for name in config.hosts}
        self.on_state = on_state

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def set_state(self, name: str, state: HostState, detail: str = "") -> None:
        self.state[name], self.detail[name] = state, detail
        if self.on_state is not None:
            self.on_state(name, state, detail)

    async def ensure(self, name: str) -> Host:
        """Connected host, or raise after setting FAILED with the reason."""
        host = self.hosts[name]
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


async def open_host(config: Config, name: str) -> Host:
    """For subcommands: the named host, connected."""
    host = Host(config.host(name))
    await host.connect()
    return host


async def stream_lines(host: Host, argv: Sequence[str]) -> AsyncIterator[str]:
    await host.connect()
    async for line in host.transport.stream(argv):
        yield line
