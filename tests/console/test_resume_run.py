"""Resuming a run from the console (issue 32 point 18), through the CLI as a subprocess against
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

import pytest

from console.demo.config import demo_profiles
from tests.paths import REPO
from tests.sshd import SSHD

pytest_plugins = ("tests.demo_workspace",)

STEPS = 30


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
