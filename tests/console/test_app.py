"""The app driven with Pilot through the same factory as the CLI: quitting, the pane keys, the
hosts list steering the panes (folded into the header on a narrow screen), footers and help."""

from __future__ import annotations

from pathlib import Path

from textual.geometry import Region
from textual.widgets import ProgressBar, TabbedContent
from textual.widgets._footer import FooterKey
from textual.widgets._progress_bar import Bar

from console.dialogs.compare import CompareScreen
from console.dialogs.help import sections
from console.panes.gpu import GpuPane
from console.screens.main import PANES
from console.widgets.footer import Footer
from console.widgets.gpu_table import GpuTable
from console.widgets.host_list import HostItem, HostList, state_text
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
        # a [hosts.X] without ssh is this machine, and the list says so
        item = hosts.query_one("#host-gpu2")
        assert "gpu2" in str(item.label.render()) and \
            "(this machine)" in str(item.label.render())  # type: ignore[attr-defined]
        hosts.focus()
        await pilot.press("down")
        await pilot.pause()
        assert app.screen.sub_title.split()[0] == "gpu2"
        gpu = app.screen.query_one(GpuPane)
        # the pane says the host's state as the header does (the pool's), then its data's age
        state = app.screen.sub_title.removeprefix("gpu2 ")
        status = app.screen.query_one(StatusLine).plain
        assert gpu.host == "gpu2" and status.startswith(f"gpu2 {state}"), (status, state)
        assert "last data 40 s ago" in status, status
        await pilot.press("down")
        await pilot.pause()
        assert gpu.host == "local"
        assert "No GPUs: NVML unavailable" in app.screen.query_one(GpuTable).plain_lines()[0]


async def test_footer_shows_each_panes_keys_after_every_switch(tmp_path: Path) -> None:
    """The footer relabels its mounted keys on a switch (it grows, hides leftovers, and
    shrinks): whatever it did, the keys on screen are the focused pane's, in binding order."""
    app = fleet_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        footer = app.screen.query_one(Footer)
        for n in "14161541":
            await pilot.press(n)
            await pilot.pause()
            shown = [(k.key, k.description) for k in footer.query(FooterKey)
                     if k.display and not k.has_class("-command-palette")]
            want = []
            for _node, b, _enabled, _tip in app.screen.active_bindings.values():
                if b.show and b.action not in {a for _k, a in want}:
                    want.append((b.key, b.action))
            # the app's q (bound on the app, so that dialogs have it) where the screen's stood
            want.remove(("q", "quit"))
            want.insert([a for _k, a in want].index("app.help"), ("q", "quit"))
            assert [k for k, _d in shown] == [k for k, _a in want], n
            assert all(d for _k, d in shown)
            labels = [d for _k, d in shown]    # never "enter Inspect  i Inspect"
            assert len(labels) == len(set(labels)), (n, labels)


async def test_hidden_progress_bars_keep_no_timers_running(tmp_path: Path) -> None:
    """The panes' progress bars are hidden most of the time: then neither the indeterminate
    animation nor the ETA tick may wake the app."""
    app = fleet_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        bars = list(app.screen.query(ProgressBar))
        assert bars and all(not b.display for b in bars)
        for bar in bars:
            timers = [*bar._timers, *bar.query_one(Bar)._timers]  # noqa: SLF001
            assert not [t for t in timers if t._active.is_set()], bar.id  # noqa: SLF001


async def test_a_narrow_screen_folds_the_hosts_list_into_the_header(tmp_path: Path) -> None:
    """Below 100 columns the hosts list gives its columns to the panes and the header names
    the host and its state; widening the terminal brings the list back."""
    app = fleet_app(tmp_path, host="gpu2")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        hosts, tabs = app.screen.query_one(HostList), app.screen.query_one(TabbedContent)
        assert not hosts.display and tabs.size.width == 80
        view = app.pool.view("gpu2")
        # the list's words for the state: "gpu2 ◌ reconnecting"
        assert app.screen.sub_title == f"gpu2 {state_text(view)}"
        assert view.state.value in str(hosts.query_one("#host-gpu2", HostItem).label.render())
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        assert hosts.display and tabs.size.width == 120 - hosts.outer_size.width


async def test_the_compare_modal_footer_shows_its_own_keys(tmp_path: Path) -> None:
    app = fleet_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("6")
        app.push_screen(CompareScreen(measure=False))
        await pilot.pause()
        footers = app.screen.query(Footer)
        shown = [k.description for f in footers for k in f.query(FooterKey) if k.display]
        assert "Close" in shown and "Measure now" in shown, shown
        assert "Convert" not in shown and "Inspect" not in shown, shown


async def test_help_wraps_descriptions_beside_their_keys(tmp_path: Path) -> None:
    """At 80 columns a long description wraps in its own column: the only lines that start
    at the left edge of help are the section titles."""
    app = fleet_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        text = app.screen.query_one("#help-text")
        lines = [s.text.rstrip() for s in
                 text.render_lines(Region(0, 0, text.size.width, text.virtual_size.height))]
        titles = {title for title, _keys in sections()}
        assert len(lines) > len(titles) * 3
        edge = [ln for ln in lines if ln and not ln.startswith(" ")]
        assert sorted(edge) == sorted(titles), set(edge) - titles
