"""Resuming a run from the console, through the CLI as a subprocess against
the real test sshd and the demo workspace: a demo finetune stopped after its first checkpoint is
started again by `launch gpu --resume RUN` in the same run directory under the same id, the
engine continues from that checkpoint (`resumed from … at step N`) and finishes; the earlier
attempt stays in the record. Refused by name: a run that succeeded, and a command without
`--resume`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from console.demo.config import demo_profiles
from tests.paths import REPO
from tests.sshd import SSHD

pytest_plugins = ("tests.demo_workspace",)

STEPS = 60  # a stop after the first checkpoint (step 5) lands long before the end


def write_config(sshd: SSHD, demo_dir: Path, tmp_path: Path) -> Path:
    finetune = demo_profiles(str(demo_dir), host="gpu", steps=STEPS,
                             extra=["--save-every", "5", "--holdout", "4"])["finetune"]
    text = (f'[hosts.gpu]\nssh = "{sshd.target}"\nknown_hosts = "{sshd.known_hosts}"\n'
            f'identity = "{sshd.user_key}"\npython = "{sys.executable}"\n'
            f'root = "{tmp_path / "root"}"\n'
            f'[profiles.finetune]\nhost = "gpu"\nrun = {json.dumps(finetune.run)}\n'
            'env = { OMP_NUM_THREADS = "1" }\n'
            '[profiles.script]\nhost = "gpu"\n'
            'run = "python -c \'import time; time.sleep(60)\'"\n')
    p = tmp_path / "config.toml"
    p.write_text(text)
    return p


def cli(config: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "console", "--config", str(config), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def wait_until(cond: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.mark.slow
def test_a_stopped_finetune_resumes_in_its_run_directory(sshd: SSHD, demo_dir: Path,
                                                         tmp_path: Path) -> None:
    config = write_config(sshd, demo_dir, tmp_path)
    r = cli(config, "launch", "finetune")
    assert r.returncode == 0, r.stderr
    rid = r.stdout.split()[0]
    run_dir = tmp_path / "root" / "runs" / rid
    ckpts = run_dir / "out" / "checkpoints"
    wait_until(lambda: ckpts.is_dir() and any(p.name.startswith("step_") for p in
                                              ckpts.iterdir()), 300, "a first checkpoint")
    assert cli(config, "stop", rid, "--grace", "20").returncode == 0
    r = cli(config, "follow", rid)
    assert r.returncode == 3, r.stderr          # stopped
    saved = max(int(p.name.split("_")[1]) for p in ckpts.iterdir()
                if re.fullmatch(r"step_\d+", p.name))

    r = cli(config, "launch", "gpu", "--resume", rid)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == rid and str(run_dir) in r.stdout   # same id, same directory
    r = cli(config, "follow", rid)
    assert r.returncode == 0, r.stdout + r.stderr
    resumed = re.findall(r"resumed from \S+/step_0*(\d+) at step (\d+)", r.stdout)
    assert resumed and int(resumed[0][1]) >= saved >= 5, r.stdout
    assert f"step {STEPS}/{STEPS}" in r.stdout and (run_dir / "out" / "final").is_dir()
    rec = json.loads(cli(config, "runs", "gpu", "--json").stdout)
    (mine,) = [x for x in rec if x["id"] == rid]
    assert mine["status"] == "succeeded" and mine["argv"][-1] == "--resume"
    assert [a["status"] for a in mine["attempts"]] == ["stopped"]

    r = cli(config, "launch", "--resume", rid)   # it succeeded: nothing to resume
    assert r.returncode == 1 and f"run {rid} succeeded: only a stopped" in r.stderr


def test_a_command_without_resume_is_refused_by_name(sshd: SSHD, tmp_path: Path) -> None:
    config = write_config(sshd, tmp_path / "no-demo", tmp_path)
    r = cli(config, "launch", "script")
    rid = r.stdout.split()[0]
    assert r.returncode == 0, r.stderr
    r = cli(config, "launch", "gpu", "--resume", rid)
    assert r.returncode == 1 and f"run {rid} is still running" in r.stderr
    assert cli(config, "stop", rid, "--grace", "5").returncode == 0
    r = cli(config, "launch", "gpu", "--resume", rid)
    assert r.returncode == 1
    assert r.stderr.strip() == (f"error: run {rid}: `python -c …` (profile script) has no "
                                "--resume: only `engine train` runs continue from their "
                                "checkpoints")


async def test_R_in_the_runs_pane_resumes_the_selected_run_or_says_why_not() -> None:
    """`R` on a run that succeeded: refused on the activity line, naming why."""
    from textual.widgets import Static

    from console.widgets.run_tables import RunTable
    from tests.panes import FINISHED, show_runs, two_runs
    from tests.runs_registry import local_app, local_config, recorded_events, upto_step
    from tests.waiting import wait_for

    root, clock = two_runs("resume-R")
    app = local_app(local_config(root), clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await show_runs(pilot, len(upto_step(recorded_events(), 60)))
        activity = app.screen.query_one("#runs-activity", Static)
        app.screen.query_one(RunTable).focus()
        await pilot.press("down")
        assert app.screen.query_one(RunTable).selected == FINISHED
        await pilot.press("R")
        said = (f"resume of {FINISHED} refused: run {FINISHED} succeeded: only a stopped, "
                "failed or lost run is resumed")
        await wait_for(pilot, lambda: said in str(activity.render()))


# -- a resumed run in the console: one run, two attempts ------------------------------------
RESUMED = "finetune-20261130-170000-r2r2"
GAP = 600.0   # the run sat stopped for ten minutes between its attempts


def resumed_run(name: str, *, second_started: bool = True) -> tuple[Path, Any, float]:
    """A finetune stopped at step 60 (its last checkpoint at 50), then resumed: the second
    attempt starts GAP s later in the same run directory and goes on from step 51 to 150
    (`second_started=False`: it is running but has written no event yet). Returns the root,
    the clock and the running time the two attempts had together."""
    from tests.replay import FrozenClock
    from tests.runs_registry import (
        event_time,
        recorded_events,
        scratch_root,
        shifted,
        upto_step,
        write_run,
    )

    lines = recorded_events()
    first = upto_step(lines, 60)
    start1, end1 = event_time(first[0]) - 3.0, event_time(first[-1]) + 1.0
    later = lines[len(upto_step(lines, 50)):]
    start2 = end1 + GAP
    dt = start2 + 3.0 - event_time(later[0])
    resumed_log = json.dumps({"v": 1, "kind": "log", "t": start2 + 2.0, "cmd": "train",
                              "level": "info", "msg": "resumed from /out/checkpoints/"
                              "step_000050 at step 50"}, separators=(",", ":"))
    second = [resumed_log, *shifted(later, dt)] if second_started else []
    end2 = event_time(second[-1]) + 1.0 if second_started else None
    root = scratch_root(name)
    run_dir = write_run(root, RESUMED, first + second,
                        status="succeeded" if second_started else "running",
                        start=start2, end=end2, exit_code=0 if second_started else None)
    rec = json.loads((run_dir / "run.json").read_text())
    rec["attempts"] = [{"start": start1, "end": end1, "exit_code": -15, "status": "stopped",
                        "argv": rec["argv"]}]
    (run_dir / "run.json").write_text(json.dumps(rec))
    now = (end2 or start2 + 5.0) + 30.0
    took = (end1 - start1) + ((end2 or now) - start2)
    return root, FrozenClock(now), took


async def open_resumed(pilot: Any, ended: bool = True) -> Any:
    from console.panes.runs import RunsPane
    from console.screens.run_detail import RunDetailScreen
    from console.widgets.run_tables import RunTable
    from tests.waiting import wait_for

    app = pilot.app
    await pilot.press("5")
    pane = app.screen.query_one(RunsPane)
    await wait_for(pilot, lambda: pane.model.listed > 0)
    table = app.screen.query_one(RunTable)
    table.focus()
    table.select(RESUMED)
    await pilot.press("enter")
    await wait_for(pilot, lambda: isinstance(app.screen, RunDetailScreen))
    screen = app.screen
    await wait_for(pilot, lambda: screen.feed.progress.events > 100)
    if ended:
        await wait_for(pilot, lambda: screen.feed.finished, 30)
    screen.refresh_view(force=True)
    await pilot.pause()
    return screen


async def test_a_resumed_run_reads_as_one_run_of_two_attempts() -> None:
    """Run detail of a run stopped at step 60 and resumed from its checkpoint at 50: a marker
    line between the attempts in the log, the loss plot by step with the second attempt going
    on from 51 (no second line over 51-60), and ELAPSED (in the Runs table and the title) the
    two attempts' running time, not the last one's alone."""
    from textual.widgets import Static

    from console.widgets.line_plot import LinePlot
    from console.widgets.log_tail import LogTail
    from console.widgets.run_tables import RunTable, fmt_duration
    from tests.runs_registry import local_app, local_config

    root, clock, took = resumed_run("resumed-detail")
    app = local_app(local_config(root), clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("5")
        await pilot.pause()
        screen = await open_resumed(pilot)
        lines = [ln.text for ln in screen.feed.progress.lines]
        marks = [i for i, t in enumerate(lines) if "attempt 2" in t]
        resumed = next(i for i, t in enumerate(lines) if t.startswith("resumed from"))
        assert len(marks) == 1 and marks[0] < resumed, lines[:40]
        assert any("checkpoint step_000050" in t for t in lines[:marks[0]])
        for plot_id in ("#plot-loss", "#plot-acc"):
            for name, pts in screen.query_one(plot_id, LinePlot).series:
                steps = [x for x, _y in pts]
                assert steps == sorted(set(steps)), (plot_id, name, steps[:70])
        loss = dict(screen.query_one("#plot-loss", LinePlot).series)["loss"]
        assert loss[0][0] == 1 and loss[-1][0] == 150, loss[:3]
        title = str(screen.query_one("#detail-title", Static).render())
        assert fmt_duration(took) in title, (title, fmt_duration(took))
        tail = screen.query_one(LogTail)
        assert any("attempt 2" in ln.text for ln in tail.lines)
        await pilot.press("escape")
        await pilot.pause()
        row = app.screen.query_one(RunTable).get_row(RESUMED)
        assert str(row[4]) == fmt_duration(took), (row, fmt_duration(took))


async def test_a_resumed_run_shows_no_rate_before_its_new_attempt_has_one() -> None:
    """Resumed, its second attempt still loading (no event of its own yet): no ETA or rate
    (it showed the stopped attempt's `ETA 1:12 · 1.23 step/s`), no marker yet either."""
    from textual.widgets import Static

    from console.runs.progress import RunProgress
    from tests.runs_registry import local_app, local_config

    root, clock, _took = resumed_run("resumed-loading", second_started=False)
    app = local_app(local_config(root), clock)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_resumed(pilot, ended=False)
        progress = str(screen.query_one("#detail-progress", Static).render())
        assert "step 60/150" in progress, progress
        assert "ETA" not in progress and "step/s" not in progress, progress
        p: RunProgress = screen.feed.progress
        assert p.rate is not None   # the first attempt's is known, and not shown
