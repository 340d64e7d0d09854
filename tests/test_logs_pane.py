"""The logs pane following a real file through the local transport (the LogFollower of
console/logs/follow.py): a 120x40 snapshot of the recorded vLLM log, follow/pause, filter, error
jumps, bounded memory and batched redraws under a fast-growing log; and the LogModel alone."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from console.app import Eagle3App
from console.logs.follow import Line
from console.logs.log_model import MAX_LINES, LogModel
from console.panes.logs import LogsPane
from console.widgets.log_view import LogView
from console.widgets.status_line import StatusLine
from tests.replay import FIXTURES, fleet_app

SIZE = (120, 40)
SERVER_LOG = FIXTURES / "vllm" / "server.log"
N_LINES = len(SERVER_LOG.read_text().splitlines())
# long enough that the status line's shortened path is the same on every machine
LOG_REL = "serving/opt/vllm/run/logs/vllm-server-2025-11-30.log"


def _app(tmp_path: Path, text: str | None = None) -> tuple[Eagle3App, Path]:
    log = tmp_path / LOG_REL
    log.parent.mkdir(parents=True)
    if text is None:
        shutil.copy(SERVER_LOG, log)
    else:
        log.write_text(text)
    app = fleet_app(tmp_path)
    app.config.hosts["gpu1"].logs = [str(log)]
    return app, log


async def _open_logs(pilot: Pilot[Any], lines: int) -> LogsPane:
    await pilot.press("4")
    pane = pilot.app.screen.query_one(LogsPane)
    end = time.monotonic() + 20
    while pane.model.total < lines:
        assert time.monotonic() < end, f"read {pane.model.total} of {lines} lines"
        await asyncio.sleep(0.05)
    pane.redraw(force=True)
    await pilot.pause()
    return pane


def test_snapshot_logs_pane(snap_compare: Any, tmp_path: Path) -> None:
    """The recorded vLLM server log: charts from its 60 stats lines, the newest lines below."""
    app, _log = _app(tmp_path)

    async def ready(pilot: Pilot[Any]) -> None:
        await _open_logs(pilot, N_LINES)

    assert snap_compare(app, terminal_size=SIZE, run_before=ready)


async def test_charts_filter_and_errors(tmp_path: Path) -> None:
    app, _log = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        pane = await _open_logs(pilot, N_LINES)
        m, view = pane.model, pane.query_one(LogView)
        assert len(m.engine) == 60 and len(m.spec) == 60 and m.errors == 3
        assert m.spec[-1].per_position == (0.776, 0.6, 0.428)
        assert view.following and view.cursor == N_LINES - 1
        # errors: newest first while following, then back and forth
        await pilot.press("e")
        assert not view.following and "ValueError" in (m.at(view.cursor) or m.lines[0]).text
        await pilot.press("E")
        assert "Traceback" in m.at(view.cursor).text  # type: ignore[union-attr]
        await pilot.press("E")
        assert "ERROR" in m.at(view.cursor).text  # type: ignore[union-attr]
        await pilot.press("e", "e")
        assert "ValueError" in m.at(view.cursor).text  # type: ignore[union-attr]
        # filter
        await pilot.press("slash", *"SpecDecoding", "enter")
        assert m.visible() == 60 and all("SpecDecoding" in m.at(i).text  # type: ignore[union-attr]
                                         for i in range(60))
        pane.redraw(force=True)
        assert "filter “SpecDecoding”: 60 lines" in pane.query_one(StatusLine).plain
        await pilot.press("escape")
        assert m.query == "" and m.visible() == N_LINES


async def test_follow_pause_and_resume_on_a_growing_file(tmp_path: Path) -> None:
    app, log = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        pane = await _open_logs(pilot, N_LINES)
        view = pane.query_one(LogView)
        await pilot.press("f")
        assert not view.following
        top = view.scroll_offset.y
        with log.open("a") as f:
            f.writelines(f"line {i}\n" for i in range(200))
        await _wait(lambda: pane.model.total == N_LINES + 200)
        pane.redraw(force=True)
        await pilot.pause()
        assert view.scroll_offset.y == top          # paused: the view stays where it was
        assert "‖ paused" in pane.query_one(StatusLine).plain
        await pilot.press("f")
        await pilot.pause()
        assert view.following and view.scroll_offset.y == view.max_scroll_y
        assert pane.model.at(view.cursor).text == "line 199"  # type: ignore[union-attr]


async def test_fast_log_is_bounded_and_redrawn_in_batches(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """40,000 lines written as fast as possible: every line read, at most MAX_LINES (20,000)
    kept, and the view redrawn a few times a second, not per line."""
    app, log = _app(tmp_path, "")
    refreshes = 0
    real_sync = LogView.sync

    def counting_sync(self: LogView, force: bool = False) -> None:
        nonlocal refreshes
        before = self._seen
        real_sync(self, force)
        refreshes += self._seen != before

    monkeypatch.setattr(LogView, "sync", counting_sync)

    def writer() -> None:
        with log.open("a") as f:
            for i in range(40_000):
                f.write(f"INFO 11-30 12:00:00 [x.py:1] request {i} done\n")
                if i % 4000 == 0:
                    f.flush()
                    time.sleep(0.05)

    async with app.run_test(size=SIZE) as pilot:
        pane = await _open_logs(pilot, 0)
        started = time.monotonic()
        t = threading.Thread(target=writer)
        t.start()
        await _wait(lambda: pane.model.total == 40_000, 30)
        t.join()
        elapsed = time.monotonic() - started
        pane.redraw()
        await pilot.pause()
        m = pane.model
        assert len(m.lines) == MAX_LINES and m.lines[-1].text.endswith("request 39999 done")
        assert m.lines[0].text.endswith(f"request {40_000 - MAX_LINES} done")
        assert refreshes <= elapsed / 0.25 + 4, (refreshes, elapsed)


async def _wait(pred: Any, timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_host_without_logs_says_how_to_add_one(tmp_path: Path) -> None:
    app = fleet_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        pane = app.screen.query_one(LogsPane)
        pane.redraw(force=True)
        assert "no logs configured: add logs = [" in pane.query_one(StatusLine).plain
        assert "[hosts.gpu1]" in pane.query_one(StatusLine).plain
        # keys that act on a log say there is none (not "no errors in this log", not nothing)
        for key in ("e", "slash", "l", "f"):
            app.clear_notifications()
            await pilot.press(key)
            await pilot.pause()
            said = [n.message for n in app._notifications]  # noqa: SLF001
            assert len(said) == 1 and said[0].startswith("no log open"), (key, said)
        assert not pane.query_one("#logs-filter").display


# -- the model alone ------------------------------------------------------------------------------

def test_model_is_bounded_and_keeps_filter_positions_valid() -> None:
    m = LogModel(max_lines=100, max_points=10)
    for start in range(0, 1000, 50):
        m.add(Line(i * 10, f"req {i} {'ERROR boom' if i % 97 == 0 else 'ok'}")
              for i in range(start, start + 50))
    assert len(m.lines) == 100 and m.total == 1000 and m.first_seq == 900
    assert m.errors == len([i for i in range(1000) if i % 97 == 0])
    m.set_query("boom")
    shown = [m.at(r).text for r in range(m.visible())]  # type: ignore[union-attr]
    assert shown == ["req 970 ERROR boom"]
    m.add([Line(0, "req 1000 ERROR boom")] + [Line(0, "x")] * 99)
    assert m.visible() == 1 and m.at(0).text == "req 1000 ERROR boom"  # type: ignore[union-attr]
    m.set_query("")
    assert m.find_error(m.visible() - 1, -1) == 0 and m.find_error(0, 1) is None


def test_model_parses_vllm_lines_with_colours() -> None:
    m = LogModel()
    m.add(Line(0, ln) for ln in SERVER_LOG.read_text().splitlines())
    assert m.total == N_LINES and len(m.engine) == 60 and len(m.spec) == 60
    assert all("\x1b" not in e.text for e in m.lines)
    assert m.engine[0].running is not None and m.spec[0].mean_acceptance_length is not None
