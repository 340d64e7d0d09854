"""Building the embedded demo's workspace on a host (`python -m engine demo init DIR`), and the
build's state; the demo's config half (profiles, paths) is console/demo/config.py.

`build_demo` runs the whole first start: it posts a DemoStatus at every change (building, with
the engine's progress; ready; failed, with why) and, once the workspace is there, adds its
profiles to the config. The Runs pane only shows what it is posted. A workspace built by an
older engine gets what it lacks (`demo update DIR`: the recorded vLLM log the Logs pane
follows) the first time it is found ready."""

from __future__ import annotations

import enum
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from console.demo.config import DEMO_ENV, SERVE_LOG, refresh_demo_profiles
from console.errors import ConsoleError, describe_error
from console.hosts.engine_client import run_engine
from console.hosts.host import Host
from console.settings.config import Config
from engine import events

#: a first build takes about a minute; a loaded machine may take several
BUILD_TIMEOUT_S = 1800.0
#: `demo update` copies one small file and imports no torch: well under a second
UPDATE_TIMEOUT_S = 120.0


async def demo_ready(host: Host, workspace: str) -> bool:
    """Whether the workspace is complete (demo.json is written last, then renamed in); one
    without the recorded vLLM log (built before it was part of one) gets it added here."""
    await host.connect()
    if await host.transport.stat(posixpath.join(workspace, "demo.json")) is None:
        return False
    if await host.transport.stat(posixpath.join(workspace, SERVE_LOG)) is None:
        try:
            await run_engine(host, ["demo", "update", workspace], timeout=UPDATE_TIMEOUT_S)
        except ConsoleError:
            # the runs do not need the log: the workspace is ready without it (the Logs pane
            # shows the missing file as empty, and takes it in if it appears)
            pass
    return True


async def ensure_demo(host: Host, workspace: str,
                      on_event: Callable[[events.Event], None] | None = None) -> dict[str, Any]:
    """Build the workspace on host unless it is there; returns what `demo init` reported
    ({} when it was already built). Raises console.hosts.engine_client.EngineError when it fails."""
    if await demo_ready(host, workspace):
        return {}
    parent = posixpath.dirname(workspace.rstrip("/"))
    await host.transport.run(["mkdir", "-p", parent], check=True)
    return await run_engine(host, ["demo", "init", workspace], timeout=BUILD_TIMEOUT_S,
                            on_event=on_event, env=DEMO_ENV)


class DemoState(enum.Enum):
    """Where the embedded demo's first start is (the Runs pane holds None before it begins)."""

    BUILDING = enum.auto()
    READY = enum.auto()
    FAILED = enum.auto()


@dataclass(frozen=True)
class DemoStatus:
    """One step of the build as the Runs pane shows it: `text` is our own words (markup for the
    keys), `detail` what the engine said (shown as plain text), done/total its progress bar."""

    state: DemoState
    text: str
    detail: str = ""
    done: int | None = None
    total: int | None = None
    error: bool = False
    toast: str = ""       # a notification as well, once the workspace is ready


FIRST = "Building the demo workspace (first start only)"


async def build_demo(host: Host, workspace: str, config: Config,
                     post: Callable[[DemoStatus], None]) -> DemoState:
    """Build the workspace unless it is there, posting each step; returns how it ended."""
    post(DemoStatus(DemoState.BUILDING, ""))
    try:
        if await demo_ready(host, workspace):
            post(DemoStatus(DemoState.READY, "Demo workspace: select a profile and press "
                            "[b]t[/b] (the finetune takes about 30 s on a CPU)"))
            return DemoState.READY
        post(DemoStatus(DemoState.BUILDING, f"{FIRST}: a tiny target, data and a public "
                        "drafter…", done=0))

        def on_event(ev: events.Event) -> None:
            if isinstance(ev, events.Progress):
                post(DemoStatus(DemoState.BUILDING, f"{FIRST}: ", done=ev.done, total=ev.total,
                                detail=f"{ev.desc or ev.cmd} {ev.done}/{ev.total or '?'} "
                                       f"{ev.unit}"))
            elif isinstance(ev, events.Log) and ev.level != "debug":
                post(DemoStatus(DemoState.BUILDING, "Building the demo workspace: ",
                                detail=ev.msg))

        info = await ensure_demo(host, workspace, on_event=on_event)
    except ConsoleError as e:
        post(DemoStatus(DemoState.FAILED, "The demo workspace could not be built: ",
                        detail=describe_error(e), error=True))
        return DemoState.FAILED
    refresh_demo_profiles(config)
    took = (info.get("seconds") or {}).get("total")
    took_text = f" ({took:.0f} s)" if isinstance(took, (int, float)) and took else ""
    post(DemoStatus(DemoState.READY, f"Demo workspace ready{took_text}: press [b]t[/b] to "
                    "finetune the public drafter, [b]enter[/b] to watch the run",
                    toast="Demo workspace ready: press t to start the finetune"))
    return DemoState.READY
