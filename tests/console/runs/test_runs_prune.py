"""Forgetting ended runs: `eagle3-console runs HOST --prune` and `P` in the Runs pane delete the
files the console wrote for runs that have ended (records and logs), keep running runs, records
they cannot trust and every file they did not write (an engine's out/, a user's notes), and
never signal a process."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from textual.widgets import Static

from console.dialogs.confirm import ConfirmScreen
from console.errors import ConsoleError
from console.hosts.host import Host, HostPool
from console.hostside import runner as runner_module
from console.hostside.records import lock_profile
from console.hostside.runner import proc_start
from console.panes.runs import RunsPane
from console.runs.service import launch, list_runs, stop_run
from console.settings.config import Config, HostConfig, Profile
from console.widgets.run_tables import RunTable
from tests.runs_registry import local_app, local_config, recorded_events, write_run
from tests.waiting import wait_for, wait_until

OWN = {"run.json", "spec.json", "output.log", "runner.log"}


def prune_cli(cfg: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "console", "--config", str(cfg), "runs", "box",
                           "--prune", *extra], capture_output=True, text=True, timeout=120)


async def wait_ended(host: Host, run_id: str) -> str:
    deadline = time.monotonic() + 30
    while True:
        recs = await list_runs(host, run_id)
        if recs and recs[0].status != "running":
            return recs[0].status
        assert time.monotonic() < deadline, f"{run_id} never ended"
        await asyncio.sleep(0.1)


async def test_runs_prune_forgets_ended_runs_and_nothing_else(tmp_path: Path) -> None:
    root = tmp_path / "host root"
    profiles = {
        "refused": Profile("refused", ["box"], "no-such-command-xyz --port 8000"),
        "writes": Profile("writes", ["box"],
                          "sh -c 'mkdir \"$0/out\" && echo w > \"$0/out/weights.txt\"' "
                          "{run_dir}"),
        "stopme": Profile("stopme", ["box"], "sleep 60"),
        "sleeper": Profile("sleeper", ["box"], "sleep 120"),
    }
    cfg_file = tmp_path / "config.toml"
    cfg_file.write_text(f'[hosts.box]\npython = "{sys.executable}"\nroot = "{root}"\n')
    config = Config(hosts={"box": HostConfig(name="box", python=sys.executable,
                                             root=str(root))}, profiles=profiles)
    pool = HostPool(config)
    try:
        with pytest.raises(ConsoleError, match="no-such-command-xyz"):
            await launch(config, "refused", pool)
        writes = await launch(config, "writes", pool)
        stopme = await launch(config, "stopme", pool)
        sleeper = await launch(config, "sleeper", pool)
        host = pool["box"]
        assert await wait_ended(host, writes.id) == "succeeded"
        assert (await stop_run(config, stopme.id, pool, grace=5)).status == "stopped"
        recs = {r.profile: r for r in await list_runs(host)}
        assert recs["refused"].status == "failed" and recs["refused"].exit_code == 127
        running_pid = recs["sleeper"].pid
    finally:
        await pool.close()
    runs = root / "runs"
    refused_dir = runs / recs["refused"].id
    (refused_dir / "notes.txt").write_text("mine\n")           # a user's file in a run folder
    (runs / stopme.id / "stop-hold.json").write_text("{}")        # a hold its engine left: ours
    (runs / "bad-20261130-100000-dddd").mkdir()                   # a record nobody can trust
    (runs / "bad-20261130-100000-dddd" / "run.json").write_text("{not json")
    (runs / "my-folder").mkdir()                                  # not a run at all
    (runs / "my-folder" / "run.log").write_text("keep\n")
    try:
        r = prune_cli(cfg_file)
        assert r.returncode == 0, r.stderr
        out = r.stdout.splitlines()
        assert out[0].startswith("forgot 3 ended runs on box: ")
        assert set(out[0].split(": ", 1)[1].split(", ")) == \
            {recs["refused"].id, writes.id, stopme.id}
        assert f"kept {sleeper.id}: running" in out
        assert any(ln.startswith("kept bad-20261130-100000-dddd: corrupt record") for ln in out)
        assert f"left {refused_dir.name}/ in place: it holds notes.txt, which the console " \
               "did not write" in out
        # what the console wrote is gone; what it did not write is where it was
        assert sorted(p.name for p in refused_dir.iterdir()) == ["notes.txt"]
        assert [p.name for p in (runs / writes.id).iterdir()] == ["out"]
        assert (runs / writes.id / "out" / "weights.txt").read_text() == "w\n"
        assert not (runs / stopme.id).exists()
        assert (runs / "bad-20261130-100000-dddd" / "run.json").read_text() == "{not json"
        assert (runs / "my-folder" / "run.log").read_text() == "keep\n"
        # the running run: its record whole, its process untouched
        assert OWN <= {p.name for p in (runs / sleeper.id).iterdir()}
        assert psutil.pid_exists(running_pid) and \
            psutil.Process(running_pid).status() != psutil.STATUS_ZOMBIE
        listed = subprocess.run([sys.executable, "-m", "console", "--config", str(cfg_file),
                                 "runs", "box", "--json"], capture_output=True, text=True,
                                timeout=120, check=True)
        assert {rec["id"] for rec in json.loads(listed.stdout)} == \
            {sleeper.id, "bad-20261130-100000-dddd"}
        again = prune_cli(cfg_file, "--json")
        assert again.returncode == 0, again.stderr
        report = json.loads(again.stdout)
        assert report["removed"] == [] and report["host"] == "box"
        assert {k["id"] for k in report["kept"]} == {sleeper.id, "bad-20261130-100000-dddd"}
    finally:
        pool = HostPool(config)
        try:
            await stop_run(config, sleeper.id, pool, grace=5)
        finally:
            await pool.close()


def test_runs_prune_on_an_unknown_host_names_it(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.box]\npython = "{sys.executable}"\nroot = "{tmp_path}"\n')
    r = subprocess.run([sys.executable, "-m", "console", "--config", str(cfg), "runs", "nosuch",
                        "--prune"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "nosuch" in r.stderr and "box" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


async def test_p_in_the_runs_pane_forgets_ended_runs_after_asking(tmp_path: Path) -> None:
    lines = recorded_events()
    t0 = time.time() - 600
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                               start_new_session=True)
    try:
        failed = write_run(tmp_path, "serve-finetune-20261130-140141-0f0f-final-20261130-"
                           "170000-abcd", [], status="failed", start=t0, end=t0 + 2,
                           exit_code=127, train_json=False)
        (failed / "out").rmdir()       # a refused serve writes no output folder
        done = write_run(tmp_path, "finetune-20261130-140141-0f0f", lines, status="succeeded",
                         start=t0 + 10, end=t0 + 150, exit_code=0)
        running = write_run(tmp_path, "finetune-20261130-160144-a1b2", lines[:20],
                            status="running", start=t0 + 200, train_json=False)
        rec = json.loads((running / "run.json").read_text())
        rec.update(pid=sleeper.pid, pgid=sleeper.pid, pid_start=proc_start(sleeper.pid))
        (running / "run.json").write_text(json.dumps(rec))
        app = local_app(local_config(tmp_path))
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("5")
            pane = app.screen.query_one(RunsPane)
            table = pane.query_one(RunTable)
            await wait_for(pilot, lambda: len(table.ids) == 3)
            await pilot.press("P")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            question = str(app.screen.query_one("#confirm-question", Static).render())
            assert "Forget the 2 ended runs on local?" in question
            await pilot.press("n")                          # no: nothing happens
            await wait_for(pilot, lambda: pane.model.busy is None)
            assert failed.exists() and len(table.ids) == 3
            await pilot.press("P")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            await wait_for(pilot, lambda: table.ids == [running.name])
            await wait_for(pilot, lambda: pane.model.busy is None)
            activity = str(pane.query_one("#runs-activity", Static).render())
            assert "forgot 2 ended runs on local" in activity
            assert not failed.exists()
            assert [p.name for p in done.iterdir()] == ["out"]     # the engine's output stays
            assert (running / "run.json").exists() and sleeper.poll() is None
            await pilot.press("P")                          # nothing left to forget
            await pilot.pause()
            assert not isinstance(app.screen, ConfirmScreen)
            assert "No ended runs to forget on local" in \
                str(pane.query_one("#runs-activity", Static).render())
    finally:
        sleeper.kill()
        sleeper.wait()



def test_prune_judges_each_run_under_its_profiles_launch_lock(tmp_path: Path) -> None:
    """A `start --resume` holds the profile's launch lock until its new attempt is recorded:
    prune waits for that lock, then sees the run running again and keeps it (without the lock
    it deleted the record of a run that was starting again)."""
    root = tmp_path / "host root"
    now = time.time()
    run_dir = write_run(root, "finetune-20261201-100000-aaaa", [], status="stopped",
                        start=now - 60, end=now - 30, exit_code=-15, train_json=False)
    runner_py = Path(runner_module.__file__)
    fd = lock_profile(str(root), "finetune")           # as start --resume takes it
    prune = subprocess.Popen([sys.executable, "-B", str(runner_py), "prune", str(root / "runs")],
                             stdout=subprocess.PIPE, text=True)
    lock_path = str(root / ".launch-finetune.lock")
    try:
        def waits_on_the_lock() -> bool:
            assert prune.poll() is None, "prune finished while the lock was held"
            try:
                fds = os.listdir(f"/proc/{prune.pid}/fd")
                return any(os.readlink(f"/proc/{prune.pid}/fd/{n}") == lock_path for n in fds)
            except OSError:
                return False
        wait_until(waits_on_the_lock, what="prune to open the launch lock")
        assert (run_dir / "run.json").exists()
        rec = json.loads((run_dir / "run.json").read_text())     # the resumed attempt, recorded
        rec.update(status="running", end=None, exit_code=None, start=time.time())
        (run_dir / "run.json").write_text(json.dumps(rec))
    finally:
        os.close(fd)
    out, _ = prune.communicate(timeout=30)
    report = json.loads(out)
    assert report["removed"] == []
    assert report["kept"] == [{"id": run_dir.name, "why": "running"}]
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"
