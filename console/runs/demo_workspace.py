"""Building the embedded demo's workspace on a host (`python -m engine demo init DIR`), the
service half of the demo; its config half (profiles, paths) is console/settings/demo_default.py."""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from typing import Any

from console.hosts.engine_client import run_engine
from console.hosts.host import Host
from console.settings.demo_default import DEMO_ENV
from engine import events

#: a first build takes about a minute; a loaded machine may take several
BUILD_TIMEOUT_S = 1800.0


async def demo_ready(host: Host, workspace: str) -> bool:
    """Whether the workspace is complete (demo.json is written last, then renamed in)."""
    await host.connect()
    return await host.transport.stat(posixpath.join(workspace, "demo.json")) is not None


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
