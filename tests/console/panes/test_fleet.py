"""The fleet view: every configured host's GPUs, one line per GPU. A snapshot on recorded events
(a live host with a lost GPU, a dropped host, a host without GPUs) and a live run that starts
the real agent on every host when the view is shown."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from console.app import create_app
from console.monitor.service import MonitorState
from console.settings.config import Config, HostConfig
from console.widgets.fleet_table import FleetTable
from tests.replay import fleet_app

SIZE = (120, 40)


def test_snapshot_fleet(snap_compare: Any, tmp_path: Path) -> None:
    """gpu1 live with GPU 5 lost, gpu2 reconnecting (greyed, STALE), local: no GPUs and why."""

    async def check(pilot: Pilot[Any]) -> None:
        await pilot.press("3")
        fleet = pilot.app.screen.query_one(FleetTable)
        by_name = {h.name: h for h in fleet.hosts}
        assert list(by_name) == ["gpu1", "gpu2", "local"]
        assert len(by_name["gpu1"].rows) == 8 and by_name["gpu1"].rows[5].error == "GPU is lost"
        assert by_name["gpu2"].state is MonitorState.RECONNECTING
        assert all(r.stale for r in by_name["gpu2"].rows)
        assert by_name["local"].rows == [] and "NVML" in (by_name["local"].reason or "")
        # one line per host plus one per GPU (a GPU-less host: one line saying why)
        assert fleet.get_content_height(None, None, 96) == (1 + 8) + (1 + 8) + (1 + 1)

    assert snap_compare(fleet_app(tmp_path), terminal_size=SIZE, run_before=check)


async def test_showing_the_fleet_starts_every_hosts_agent(tmp_path: Path) -> None:
    config = Config(hosts={n: HostConfig(name=n, python=sys.executable, root=str(tmp_path / n))
                           for n in ("a", "b")})
    app = create_app(config, host="a")
    app.monitors.interval = 0.5
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.monitors["b"].state is MonitorState.STARTING   # not watched until shown
        await pilot.press("3")
        end = time.monotonic() + 40
        while not all(m.sample is not None for m in app.monitors.monitors.values()):
            assert time.monotonic() < end, "agents did not report"
            await asyncio.sleep(0.1)
        app.screen.query_one("#pane-fleet").refresh_view(force=True)  # type: ignore[attr-defined]
        await pilot.pause()
        hosts = app.screen.query_one(FleetTable).hosts
        assert [h.name for h in hosts] == ["a", "b"]
        assert all(h.state is MonitorState.LIVE and h.source == "engine" for h in hosts)
