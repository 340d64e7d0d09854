"""Building the embedded demo's workspace on a host (`python -m engine demo init DIR`), the
service half of the demo; its config half (profiles, paths) is console/settings/demo_default.py.
A workspace built by an older engine gets what it lacks (`demo update DIR`: the recorded vLLM
log the Logs pane follows) the first time it is found ready."""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from typing import Any

from console.errors import ConsoleError
from console.hosts.engine_client import run_engine
from console.hosts.host import Host
from console.settings.demo_default import DEMO_ENV, SERVE_LOG
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
