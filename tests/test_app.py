"""The app driven with Pilot through the same factory as the CLI: quitting, the pane keys, and the
hosts list steering the panes."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import TabbedContent

from console.panes.gpu import GpuPane
from console.screens.main import PANES
from console.widgets.gpu_table import GpuTable
from console.widgets.host_list import HostList
from console.widgets.status_line import StatusLine
from tests.replay import fleet_app

SIZE = (120, 40)


async def test_q_quits(tmp_path: Path) -> None:
    app = fleet_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running


async def test_number_keys_switch_panes_in_panes_order(tmp_path: Path) -> None:
    app = fleet_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        tabs = app.screen.query_one(TabbedContent)
        assert tabs.active == f"tab-{PANES[0][0]}"
        for n, (tab_id, _title, _cls) in reversed(list(enumerate(PANES, start=1))):
            await pilot.press(str(n))
            assert tabs.active == f"tab-{tab_id}"
        app.screen.query_one("#gpu-table").focus()   # keys work from inside a pane too
        await pilot.press(str(next(i for i, p in enumerate(PANES, 1) if p[0] == "fleet")))
        assert tabs.active == "tab-fleet"


async def test_host_list_selects_the_host_for_every_pane(tmp_path: Path) -> None:
    app = fleet_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        hosts = app.screen.query_one(HostList)
        hosts.focus()
        await pilot.press("down")
        await pilot.pause()
        assert app.screen.sub_title == "gpu2"
        gpu = app.screen.query_one(GpuPane)
        assert gpu.host == "gpu2" and "reconnecting" in app.screen.query_one(StatusLine).plain
        await pilot.press("down")
        await pilot.pause()
        assert gpu.host == "local"
        assert "No GPUs: NVML unavailable" in app.screen.query_one(GpuTable).plain_lines()[0]
