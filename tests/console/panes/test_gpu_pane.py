"""The GPU pane on recorded monitor events at a frozen clock: SVG snapshots at 120x40 (8 GPUs with
one lost and stale, the detail view, a dropped host), and Pilot checks of what the snapshots
cannot say (sorting, staleness as time passes, the screen staying responsive)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual.widgets import TabbedContent

from console.monitor.service import MonitorState
from console.panes.gpu import GpuPane
from console.settings.config import Config, HostConfig
from console.widgets.gpu_table import GpuTable
from console.widgets.process_table import ProcessTable
from console.widgets.status_line import StatusLine
from tests.replay import NOW, FrozenClock, fleet_app

SIZE = (120, 40)


def test_snapshot_gpu_pane_eight_gpus_one_stale(snap_compare: Any, tmp_path: Path) -> None:
    """gpu1: 8x H200 serving vLLM, GPU 5 lost 8.5 s ago (stale at three 2 s intervals)."""
    assert snap_compare(fleet_app(tmp_path), terminal_size=SIZE)


def test_snapshot_gpu_detail_view(snap_compare: Any, tmp_path: Path) -> None:
    """`d` opens the detail of the GPU under the cursor (moved to GPU 2): clocks, PCIe, fan,
    pstate, ECC and four 5-minute history lines."""

    async def open_detail(pilot: Pilot[Any]) -> None:
        from console.widgets.gpu_detail import GpuDetail

        pilot.app.screen.query_one(GpuTable).focus()
        await pilot.press("down", "down", "d")
        detail = pilot.app.screen.query_one(GpuDetail)
        assert detail.display and detail.row is not None and detail.row.gpu.index == 2

    assert snap_compare(fleet_app(tmp_path), terminal_size=SIZE, run_before=open_detail)


def test_snapshot_gpu_pane_reconnecting_host(snap_compare: Any, tmp_path: Path) -> None:
    """gpu2's monitor dropped, its link up again: `● connected` as the header says, `starting the
    monitor agent…`, its last data greyed and every GPU tagged stale."""
    assert snap_compare(fleet_app(tmp_path, host="gpu2"), terminal_size=SIZE)


async def test_rows_status_and_staleness_as_time_passes(tmp_path: Path) -> None:
    clock = FrozenClock()
    app = fleet_app(tmp_path, clock=clock)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        pane, table = app.screen.query_one(GpuPane), app.screen.query_one(GpuTable)
        status = app.screen.query_one(StatusLine)
        assert [r.gpu.index for r in table.rows] == list(range(8))
        assert [r.stale for r in table.rows] == [False] * 5 + [True] + [False] * 2
        assert table.rows[5].error == "GPU is lost"
        assert len(table.rows[0].history) >= 150   # 5 min of 2 s samples
        assert "● live" in status.plain and "8 × NVIDIA H200" in status.plain
        assert "550.54.15" in status.plain
        clock.t = NOW + 5.4            # 5.9 s after the last sample: not yet three intervals
        pane.refresh_view(force=True)
        await pilot.pause()
        assert "● live" in status.plain and not pane.has_class("-down")
        clock.t = NOW + 6.0            # 6.5 s > 3 x 2 s
        pane.refresh_view(force=True)
        await pilot.pause()
        assert "STALE: last sample 6 s ago" in status.plain
        assert all(r.stale for r in table.rows) and pane.has_class("-down")


async def test_process_table_sorts_by_each_column(tmp_path: Path) -> None:
    app = fleet_app(tmp_path, host="gpu2")
    async with app.run_test(size=SIZE) as pilot:
        procs = app.screen.query_one(ProcessTable)
        procs.focus()
        await pilot.pause()

        def column(i: int) -> list[str]:
            return [str(procs.get_row_at(r)[i]) for r in range(procs.row_count)]

        assert procs.row_count == 8 and procs.sort_column == 3
        await pilot.press("s")                          # -> TYPE
        await pilot.press("s")                          # -> COMMAND
        await pilot.press("s", "s")                     # -> GPU, then PID
        assert procs.sort_column == 1
        assert column(1) == sorted(column(1), key=int)
        assert "PID ▲" in str(procs.ordered_columns[1].label)
        procs.sort_by(0)
        await pilot.pause()
        assert column(0) == [str(i) for i in range(8)]


async def test_screen_stays_responsive_while_a_host_hangs(tmp_path: Path) -> None:
    """A host whose agent never answers (a Python that sleeps) must not block the screen."""
    hang = tmp_path / "hang-python"
    hang.write_text("#!/bin/sh\nexec sleep 600\n")
    hang.chmod(0o755)
    config = Config(hosts={"stuck": HostConfig(name="stuck", python=str(hang),
                                               root=str(tmp_path / "root"))})
    from console.app import create_app

    app = create_app(config)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        tabs = app.screen.query_one(TabbedContent)
        started = time.monotonic()
        for key, tab in (("2", "tab-overview"), ("3", "tab-fleet"), ("1", "tab-gpu")):
            await pilot.press(key)
            assert tabs.active == tab
        # a screen that waited on the host would sit out the agent's 10 s stall timeout
        assert time.monotonic() - started < 8.0
        await asyncio.sleep(0.5)
        assert app.monitors["stuck"].state is MonitorState.STARTING
        assert "starting the monitor agent" in app.screen.query_one(StatusLine).plain


async def test_a_failed_host_reads_failed_in_the_pane_and_the_hosts_list(tmp_path: Path) -> None:
    """The hosts list and the GPU pane use one word for one host: `failed` when the last
    connect failed (the monitor retrying is said after it), not `reconnecting` beside it."""
    from console.hosts.host import HostState
    from console.widgets.host_list import HostList

    app = fleet_app(tmp_path, host="gpu2")
    async with app.run_test(size=SIZE) as pilot:
        app.pool.set_state("gpu2", HostState.FAILED, "gpu2: cannot connect: refused")
        await pilot.pause()
        pane = app.screen.query_one(GpuPane)
        pane.refresh_view(force=True)
        status = app.screen.query_one(StatusLine).plain
        item = app.screen.query_one(HostList).query_one("#host-gpu2")
        assert "failed" in str(item.label.render())  # type: ignore[attr-defined]
        assert "failed" in status and "reconnecting" not in status
        assert "gpu2: cannot connect: refused" in status
