"""A pipeline in the Runs pane: its three parts' records (as the host-side runner writes them,
each linked to the pipeline) are one row with each part's state, and opening it shows the
trainer's plots with the stream's charts, drawn from the parts' events (the producer's pool
and pauses, the trainer's waits and tokens per second); `t` launches one and `x` stops all of
its parts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from console.dialogs.confirm import ConfirmScreen
from console.scheduler.run_status import RunStatus
from console.screens.main import MainScreen
from console.screens.run_detail import RunDetailScreen
from console.settings.config import Pipeline, Profile
from console.widgets.line_plot import PAUSED, WAITED, LinePlot, StreamCharts
from console.widgets.run_tables import RUN_COLUMNS, RunTable
from engine import events
from tests.panes import runs_pane
from tests.replay import FrozenClock
from tests.runs_registry import local_app, local_config, write_run
from tests.waiting import wait_for

pytest_plugins = ("tests.stream_store",)

PIPE = "pipe-20261206-100000-abcd"
T0 = 1_780_000_000.0
STEPS = 4


def producer_events() -> list[str]:
    """Five pool reports 10 s apart: 64 samples (6,400 tokens) put each time, paused 5 s of the
    last 10."""
    return [events.encode("metric", "stream-put", {
        "name": "stream producer", "step": None,
        "values": {"pool_samples": 20 + i, "pool_bytes": (20 + i) << 20, "produced": 64 * i,
                   "tokens": 6400 * i, "paused_s": 5.0 * i, "put_s": 0.5 * i}}, t=T0 + 10 * i)
        for i in range(5)]


def trainer_events() -> list[str]:
    """Four steps 10 s apart, each with its numbers (1,000 tokens/s) and its stream figures
    (2 s waited of each 10)."""
    out = []
    for step in range(1, STEPS + 1):
        t = T0 + 10 * step
        out.append(events.encode("metric", "train", {"step": step, "values": {
            "loss": 5.0 - step / 10, "tau": 1.5, "acc_0": 0.5, "tokens_per_s": 1000.0}}, t=t))
        out.append(events.encode("metric", "train", {"name": "stream trainer", "step": step,
                                                      "values": {"wait_s": 2.0 * step,
                                                                 "waits": step, "read_s": 0.1,
                                                                 "ack_s": 0.01}}, t=t))
        out.append(events.encode("progress", "train", {"done": step, "total": STEPS,
                                                        "unit": "step", "desc": "train"}, t=t))
    return out


def write_pipeline(root: Path) -> None:
    parts = {"store": ([events.encode("log", "stream-master", {"msg": "stream store at x"},
                                      t=T0)], "stopped", 3),
             "producer": (producer_events(), "succeeded", 0),
             "trainer": (trainer_events(), "succeeded", 0)}
    for part, (lines, status, code) in parts.items():
        run_dir = write_run(root, f"{PIPE}.{part}", lines, status=status, start=T0,
                            end=T0 + 60, exit_code=code, train_json=False)
        rec = json.loads((run_dir / "run.json").read_text())
        rec.update(pipeline=PIPE, part=part)
        (run_dir / "run.json").write_text(json.dumps(rec))


async def test_a_pipeline_is_one_row_and_opens_with_the_streams_charts(tmp_path: Path) -> None:
    write_pipeline(tmp_path)
    app = local_app(local_config(tmp_path), FrozenClock(T0 + 100))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("5")
        pane = runs_pane(pilot)
        await wait_for(pilot, lambda: pane.model.listed > 0)
        table = app.screen.query_one(RunTable)
        await wait_for(pilot, lambda: table.ids == [PIPE] and table.rows_shown[0][2] == "4/4",
                       what="the pipeline's row with its trainer's progress")
        row = dict(zip(RUN_COLUMNS, table.rows_shown[0], strict=True))
        assert row["STATUS"] == "✔ succeeded (store■ producer✔ trainer✔)"
        assert row["ELAPSED"] == "1:00"
        table.focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RunDetailScreen))
        screen = app.screen
        assert isinstance(screen, RunDetailScreen)
        assert screen.pipeline is not None and screen.feed.run_id == f"{PIPE}.trainer"
        await wait_for(pilot, lambda: all(f.finished for f in screen.pipeline.feeds.values()),
                       what="every part's feed read to its end")
        screen.refresh_view(force=True)
        plots = {p.id: p for p in screen.query(LinePlot)}
        assert screen.query_one(StreamCharts).display and not plots["plot-acc"].display
        # the producer: 6,400 tokens every 10 s, the pool 20..24 samples (MiB alike), paused half
        assert plots["stream-produced"].series == [("tokens/s", [(x, 640.0) for x in
                                                                 (10.0, 20.0, 30.0, 40.0)])]
        assert [y for _x, y in plots["stream-pool"].series[0][1]] == [20, 21, 22, 23, 24]
        assert [y for _x, y in plots["stream-bytes"].series[0][1]] == [20, 21, 22, 23, 24]
        # the trainer: its tokens/s at each step, 2 s waited of each 10 between its figures
        assert plots["stream-tokens"].series == [("tokens/s", [(10.0 * s, 1000.0)
                                                               for s in range(1, 5)])]
        wait = dict(plots["stream-wait"].series)
        assert wait[PAUSED] == [(x, 0.5) for x in (10.0, 20.0, 30.0, 40.0)]
        assert wait[WAITED] == [(x, 0.2) for x in (20.0, 30.0, 40.0)]
        title = str(screen.query_one("#detail-title").render())
        assert f"pipeline {PIPE} · succeeded · store■ producer✔ trainer✔" in title
        await pilot.press("escape")
        assert isinstance(app.screen, MainScreen)


SLEEP = "python -c 'import sys, time; time.sleep(120)' {stream}"


@pytest.mark.usefixtures("mooncake")
async def test_t_launches_a_pipeline_and_x_stops_every_part(tmp_path: Path) -> None:
    """From the pane, on this machine: `t` starts the store (a real Mooncake master), then a
    producer and a trainer that only wait (they are given the store's address); the row shows
    the three running; `x` (confirmed) stops all three, each by PID and start time."""
    config = local_config(tmp_path / "host")
    waiter = Profile(name="pipe.part", hosts=["local"], run=SLEEP)
    config.profiles = {"pipe": Profile(name="pipe", hosts=["local"], run="", pipeline=Pipeline(
        store_host="local", producer=waiter, trainer=waiter))}
    app = local_app(config)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("5")
        pane = runs_pane(pilot)
        await wait_for(pilot, lambda: pane.model.listed > 0)
        table = app.screen.query_one(RunTable)
        await pilot.press("t")
        await wait_for(pilot, lambda: pane.model.busy is None and len(table.ids) == 1
                       and "store▶ producer▶ trainer▶" in table.rows_shown[0][1],
                       what="the launched pipeline's row", timeout=60)
        pid = table.ids[0]
        assert pid.startswith("pipe-") and table.rows_shown[0][1].startswith("▶ running")
        producer = next(r for r in pane.model.records["local"] if r.part == "producer")
        assert producer.argv[-1].startswith("127.0.0.1:")     # the address the store gave
        table.focus()
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await wait_for(pilot, lambda: pane.model.busy is None and
                       {r.status for r in pane.model.records["local"]} == {RunStatus.STOPPED},
                       what="every part stopped")
        assert sorted(r.part for r in pane.model.records["local"]) == \
            ["producer", "store", "trainer"]
        await wait_for(pilot, lambda: table.rows_shown[0][1].startswith("■ stopped"))
