"""Running the engine on a host: push it when needed, `python -m engine ... --events`, doctor.

This sits above console/hosts/push.py (it pushes the engine before the first call) and
console/hosts/host.py (a configured host and its transport), so neither imports the other. The
engine is invoked as `PYTHON -m engine ... --events` with PYTHONPATH=ROOT/code (where `push` puts
the engine package), so a host runs the code the console pushed to it; a fresh host just works.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from console.errors import CommandFailed, ConsoleError
from console.hosts.host import Host
from console.hosts.push import engine_trees, push
from engine import events


@dataclass
class EngineError(ConsoleError):
    """An engine command failed on a host: the engine's own one-line message."""

    host: str
    message: str

    def __str__(self) -> str:
        return f"{self.host}: {self.message}"


async def ensure_engine(host: Host, force: bool = False) -> None:
    """Push the engine package and host helpers when they differ from this console's copy.

    Checked once per Host (an unchanged engine costs two small SFTP reads); force re-checks."""
    if host.engine_pushed and not force:
        return
    await push(host, await engine_trees(host))   # sets host.engine_pushed


async def engine_argv(host: Host, args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """argv and env that run `python -m engine ARGS` with the pushed code first on the path."""
    env = {"PYTHONPATH": await host.code_dir(), "PYTHONUNBUFFERED": "1"}
    return [host.cfg.python, "-m", "engine", *args], env


async def run_engine(host: Host, args: Sequence[str], *, timeout: float | None = None,
                     on_event: Callable[[events.Event], None] | None = None,
                     env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run an engine command with --events; return its result data or raise EngineError.

    on_event sees every event (progress bars in panes) as it arrives; env is added to the
    command's environment (e.g. OMP_NUM_THREADS)."""
    await host.connect()
    await ensure_engine(host)
    args = list(args)
    # options before a `--` (after it every word is a positional, e.g. a path `-x`)
    cut = args.index("--") if "--" in args else len(args)
    argv, full_env = await engine_argv(host, [*args[:cut], "--events", *args[cut:]])
    full_env.update(env or {})
    result: dict[str, Any] | None = None
    error: str | None = None

    async def read() -> None:
        nonlocal result, error
        async for line in host.transport.stream(argv, env=full_env):
            ev = events.parse(line)
            if ev is None:
                continue
            if on_event is not None:
                on_event(ev)
            if isinstance(ev, events.Result):
                result = dict(ev.data)
            elif isinstance(ev, events.Error):
                error = ev.msg or f"engine {' '.join(args[:1])} failed without a message"

    try:
        await asyncio.wait_for(read(), timeout)  # not asyncio.timeout: the floor is Python 3.10
    except CommandFailed as e:
        raise EngineError(host.name, error or engine_failure(e)) from e
    except asyncio.TimeoutError as e:
        what = " ".join(args[:1])
        raise EngineError(host.name, f"engine {what} took over {timeout:.0f} s") from e
    if error is not None:
        raise EngineError(host.name, error)
    if result is None:
        raise EngineError(host.name, f"engine {' '.join(args[:1])} ended without a result")
    return result


async def doctor(host: Host, path: str | None = None) -> dict[str, Any]:
    """The engine's doctor report for this host (free disk measured at the host's root), with
    `pushed`: where the engine was pushed for it and how many files that sent (0: up to date)."""
    root = path or await host.root()
    await host.connect()
    await host.transport.run(["mkdir", "-p", root])
    sent = await push(host, await engine_trees(host))
    host.engine_pushed = True
    report = await run_engine(host, ["doctor", "--path", root], timeout=120)
    report["pushed"] = {"dir": await host.code_dir(), "files_sent": sent.files_sent,
                        "manifest": sent.manifest}
    return report


def engine_failure(e: CommandFailed) -> str:
    """One line for an engine command that died without its own error event."""
    text = e.stderr or ""
    if "No module named engine" in text:
        return "the engine is not on this host yet: run `eagle3-console push HOST`"
    if "No module named" in text:
        return "the host's Python lacks a package: " + text.strip().splitlines()[-1]
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else str(e)
