"""Driving the app's Runs, Checkpoints and Logs panes with Pilot, shared by the pane, detail,
small terminal, serve, compare and hostile-host tests: the recorded runs, the drafter shelf and
the server log they show, opening a pane (or a run's detail, or the compare table) and waiting
for its first listing."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from console.app import Eagle3App
from console.dialogs.compare import CompareScreen
from console.panes.checkpoints import CheckpointsPane
from console.panes.logs import LogsPane
from console.panes.runs import RunsPane
from console.runs.watch import RunFeed
from console.screens.main import MainScreen
from console.screens.run_detail import RunDetailScreen
from console.widgets.inspect_view import InspectView
from console.widgets.run_tables import RunTable
from tests.drafters import write_drafter
from tests.replay import FIXTURES, FrozenClock, fleet_app
from tests.runs_registry import (
    event_time,
    local_app,
    local_config,
    recorded_events,
    scratch_root,
    shifted,
    upto_step,
    write_run,
)
from tests.waiting import wait_for

# -- the Runs pane: a finished and a running demo finetune ----------------------------------

RUNNING = "finetune-20261130-160144-a1b2"
FINISHED = "finetune-20261130-140141-0f0f"
LATER = 7200.0   # the running run started two hours after the finished one


def two_runs(name: str) -> tuple[Path, FrozenClock]:
    """A finished finetune (all 150 steps) and a running one (60 of 150 steps so far), in a folder
    of the test's own (these panes show no paths)."""
    root = scratch_root(name)
    lines = recorded_events()
    t0, t1 = event_time(lines[0]) - 3.0, event_time(lines[-1])
    write_run(root, FINISHED, lines, status="succeeded", start=t0, end=t1 + 1, exit_code=0,
              best=(3.441, 150))
    partial = shifted(upto_step(lines, 60), LATER)
    write_run(root, RUNNING, partial, status="running", start=t0 + LATER)
    return root, FrozenClock(event_time(partial[-1]) + 0.4)


def runs_pane(pilot: Pilot[Any]) -> RunsPane:
    main = next(s for s in pilot.app.screen_stack if isinstance(s, MainScreen))
    return main.query_one(RunsPane)


def feed_of(pilot: Pilot[Any], run_id: str) -> RunFeed | None:
    return runs_pane(pilot).model.feeds.find("local", run_id)


async def show_runs(pilot: Pilot[Any], n_running: int) -> None:
    await pilot.press("5")
    pane = pilot.app.screen.query_one(RunsPane)
    await wait_for(pilot, lambda: pane.model.listed > 0)
    await wait_for(pilot, lambda: (f := feed_of(pilot, RUNNING)) is not None
                   and f.progress.events == n_running and f.train_run is not None)
    pane.refresh_view(force=True)
    await pilot.pause()


async def open_finished(pilot: Pilot[Any]) -> RunDetailScreen:
    """Run detail of the finished run, read to its end."""
    await show_runs(pilot, len(upto_step(recorded_events(), 60)))
    app = pilot.app
    app.screen.query_one(RunTable).focus()
    await pilot.press("down", "enter")
    await wait_for(pilot, lambda: isinstance(app.screen, RunDetailScreen))
    screen = app.screen
    assert isinstance(screen, RunDetailScreen)
    feed = screen.feed
    await wait_for(pilot, lambda: feed.finished and
                   feed.progress.events == len(recorded_events()))
    screen.refresh_view(force=True)
    await pilot.pause()
    return screen


# -- the Checkpoints pane: a shelf of drafters and a run's output ------------------------

CHECKPOINTS_SIZE = (120, 40)   # the terminal of the Checkpoints pane's tests and snapshot
MTIME = 1_764_504_000.0   # fixed modification times: the list shows them
# what training writes beside out/final (engine/training/train.py's export; fixed values)
TRAINED_PROVENANCE = {"engine_version": "0.1.0", "time": "2026-11-30T14:30:00+0000",
                      "format": "eagle", "step": 150, "held_out_tau": 3.441,
                      "data_sha256": "552e8375cd4b" + "1" * 52,
                      "vocab_sha256": "ce005e6fa3fa" + "2" * 52, "draft_vocab_size": 128}


def checkpoints_tree(root: Path) -> Path:
    """A configured folder with two drafters (EAGLE single-file, speculators sharded) and a run
    output; returns the configured folder."""
    shelf = root / "shelf"
    write_drafter(shelf / "aq-medai-eagle3", seed=1)
    write_drafter(shelf / "speculators-sharded", style="speculators", layout="sharded", seed=2)
    final = root / "host" / "runs" / "finetune-20261130-140141-0f0f" / "out" / "final"
    write_drafter(final, seed=3)
    (final / "provenance.json").write_text(json.dumps(TRAINED_PROVENANCE | {
        "run": str(final.parent), "finetune": {
            "path": str(shelf / "aq-medai-eagle3"), "format": "eagle",
            "sha256": {"model.safetensors": "3f1c9a0b7d2e" + "0" * 52}}}))
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            os.utime(os.path.join(dirpath, n), (MTIME, MTIME))
    return shelf


def app_for(root: Path, shelf: Path) -> Any:
    return local_app(local_config(root / "host", checkpoints=[str(shelf)]),
                     FrozenClock(MTIME + 60))


def pane_of(pilot: Pilot[Any]) -> CheckpointsPane:
    main = next(s for s in pilot.app.screen_stack if isinstance(s, MainScreen))
    return main.query_one(CheckpointsPane)


async def open_pane(pilot: Pilot[Any]) -> CheckpointsPane:
    await pilot.press("6")
    pane = pane_of(pilot)
    await wait_for(pilot, lambda: pane.scans > 0)
    return pane


def report_shown(pane: CheckpointsPane, path: str) -> bool:
    view = pane.query_one(InspectView)
    return view.report is not None and view.heading.endswith(path)


async def open_compare(pilot: Pilot[Any]) -> CompareScreen:
    """`m` on the Checkpoints pane, once the table has measured what runs."""
    app = pilot.app
    await pilot.press("6")
    await pilot.press("m")
    await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen)
                   and app.screen.measured >= 1)
    assert isinstance(app.screen, CompareScreen) and app.is_running
    return app.screen


# -- the Logs pane: the recorded vLLM server log on a fleet host -----------------------------

SERVER_LOG = FIXTURES / "vllm" / "server.log"
N_LINES = len(SERVER_LOG.read_text().splitlines())
# long enough that the status line's shortened path is the same on every machine
LOG_REL = "serving/opt/vllm/run/logs/vllm-server-2025-11-30.log"


def logs_app(tmp_path: Path, text: str | None = None) -> tuple[Eagle3App, Path]:
    """The fleet app with host gpu1 following one log: the recorded one, or `text`."""
    log = tmp_path / LOG_REL
    log.parent.mkdir(parents=True)
    if text is None:
        shutil.copy(SERVER_LOG, log)
    else:
        log.write_text(text)
    app = fleet_app(tmp_path)
    app.config.hosts["gpu1"].logs = [str(log)]
    return app, log


async def open_logs(pilot: Pilot[Any], lines: int) -> LogsPane:
    """`4`, then until the pane has read `lines` lines."""
    await pilot.press("4")
    pane = pilot.app.screen.query_one(LogsPane)
    end = time.monotonic() + 20
    while pane.model.total < lines:
        assert time.monotonic() < end, f"read {pane.model.total} of {lines} lines"
        await asyncio.sleep(0.05)
    pane.redraw(force=True)
    await pilot.pause()
    return pane
