"""Polling instead of sleeping, in one place: wait for a condition in a running app (Pilot) or in
this process, and fail with what was awaited when it does not come in time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from textual.pilot import Pilot


async def wait_for(pilot: Pilot[Any], cond: Callable[[], object], timeout: float = 90.0,
                   what: str = "the app", state: Callable[[], object] | None = None) -> None:
    """Let the app run until `cond()` holds; fails at once if the app ended meanwhile, saying
    `state()` (what the app showed instead) when given."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert pilot.app.is_running, f"the app ended while waiting for {what}"
        if time.monotonic() > deadline:
            shown = "" if state is None else f"; instead: {state()!r}"
            raise AssertionError(f"timed out waiting for {what}{shown}")
        await pilot.pause(0.05)


def wait_until(cond: Callable[[], object], timeout: float = 20.0,
               what: str = "condition") -> None:
    """Poll `cond()` from this thread (a subprocess or a file written by another process)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


async def wait_port(port: int, timeout: float = 30) -> None:
    """Until something accepts connections on 127.0.0.1:port."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"nothing listens on 127.0.0.1:{port}") from None
            await asyncio.sleep(0.1)
