"""`stop` (and the Runs pane's `x`) on a host that cannot be reached or does not answer names
that host within seconds, instead of blaming the run ("no run ... on any configured host");
once the host answers again the same stop works. A real sshd on 127.0.0.1, stopped (or
frozen) and started again."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from console.errors import Unreachable
from console.hosts.host import HostPool
from console.runs.service import launch, resume_run, stop_run
from console.settings.config import Config, HostConfig, Profile
from tests.console_cli import cli
from tests.sshd import SSHD


def toml(sshd: SSHD, tmp_path: Path) -> Path:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[hosts.gpu]\nssh = "{sshd.target}"\npython = "{sys.executable}"\n'
                   f'root = "{tmp_path / "root"}"\nknown_hosts = "{sshd.known_hosts}"\n'
                   f'identity = "{sshd.user_key}"\n'
                   '[profiles.sleeper]\nhost = "gpu"\nrun = "sleep 60"\n')
    return cfg


def test_stop_names_the_host_it_cannot_reach(sshd: SSHD, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    cfg = toml(sshd, tmp_path)
    code, out, err = cli(capsys, cfg, "launch", "sleeper")
    assert code == 0, err
    run_id = out.splitlines()[0]
    sshd.stop()
    try:
        t0 = time.monotonic()
        code, out, err = cli(capsys, cfg, "stop", run_id, "--grace", "2")
        took = time.monotonic() - t0
    finally:
        sshd.restart()
    assert code == 1 and out == "" and err.count("\n") == 1, (out, err)
    assert err.startswith("error: gpu: could not be reached (") and run_id in err, err
    assert "no run" not in err
    assert took < 10, took
    code, out, err = cli(capsys, cfg, "stop", run_id, "--grace", "2")
    assert code == 0 and out.strip() == f"{run_id} on gpu: stopped (exit -15)", (out, err)


async def test_stop_through_a_connected_pool_whose_host_went_away(sshd: SSHD,
                                                                  tmp_path: Path) -> None:
    """The Runs pane's path: the pool was connected when the host went away. The error is an
    Unreachable naming the host (the pane clears it once the host answers again); resume says
    the same."""
    box = HostConfig(name="gpu", ssh=sshd.target, known_hosts=str(sshd.known_hosts),
                     identity=str(sshd.user_key), python=sys.executable,
                     root=str(tmp_path / "root"))
    config = Config(hosts={"gpu": box},
                    profiles={"sleeper": Profile("sleeper", ["gpu"], "sleep 60")})
    pool = HostPool(config)
    try:
        run = await launch(config, "sleeper", pool)
        sshd.stop()
        try:
            t0 = time.monotonic()
            with pytest.raises(Unreachable) as got:
                await stop_run(config, run.id, pool, grace=2)
            took = time.monotonic() - t0
            with pytest.raises(Unreachable):
                await resume_run(config, run.id, pool)
        finally:
            sshd.restart()
        assert got.value.host == "gpu"
        assert str(got.value).startswith("gpu: could not be reached (")
        assert took < 20, took
        assert (await stop_run(config, run.id, pool, grace=2)).status == "stopped"
    finally:
        await pool.close()


async def test_stop_on_a_frozen_host_gives_up_within_the_reach_timeout(
        sshd: SSHD, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host that stops answering keeps its link up for a minute (keepalives) and a reconnect
    to it times out try after try: the lookup gives up after REACH_TIMEOUT (3 s here) and says
    the host did not answer; once it answers again the stop goes through."""
    import signal

    import psutil

    from console.runs import service

    monkeypatch.setattr(service, "REACH_TIMEOUT", 3.0, raising=False)
    box = HostConfig(name="gpu", ssh=sshd.target, known_hosts=str(sshd.known_hosts),
                     identity=str(sshd.user_key), python=sys.executable,
                     root=str(tmp_path / "root"))
    config = Config(hosts={"gpu": box},
                    profiles={"sleeper": Profile("sleeper", ["gpu"], "sleep 60")})
    pool = HostPool(config)
    try:
        run = await launch(config, "sleeper", pool)
        assert sshd.proc is not None
        frozen = [psutil.Process(sshd.proc.pid),
                  *(p for k in sshd.children() for p in [k, *k.children(recursive=True)])]
        for p in frozen:
            p.send_signal(signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.raises(Unreachable) as got:
                await stop_run(config, run.id, pool, grace=2)
            took = time.monotonic() - t0
        finally:
            for p in frozen:
                p.send_signal(signal.SIGCONT)
        assert str(got.value).startswith("gpu: could not be reached (no answer within 3 s)")
        assert took < 10, took
        assert (await stop_run(config, run.id, pool, grace=2)).status == "stopped"
    finally:
        await pool.close()


async def test_x_on_an_unreachable_host_says_so_until_it_answers_again(sshd: SSHD,
                                                                        tmp_path: Path) -> None:
    """The Runs pane: `x` with the host's sshd stopped says the host could not be reached
    (not that no host has the run); once the host answers again the line says so, instead of
    the failure staying beside a run that reads succeeded."""
    from textual.widgets import Static

    from console.dialogs.confirm import ConfirmScreen
    from console.panes.runs import RunsPane
    from console.widgets.run_tables import RunTable
    from tests.runs_registry import local_app
    from tests.waiting import wait_for

    box = HostConfig(name="gpu", ssh=sshd.target, known_hosts=str(sshd.known_hosts),
                     identity=str(sshd.user_key), python=sys.executable,
                     root=str(tmp_path / "root"))
    config = Config(hosts={"gpu": box},
                    profiles={"sleeper": Profile("sleeper", ["gpu"], "sleep 60")})
    pool = HostPool(config)
    try:
        run = await launch(config, "sleeper", pool)
    finally:
        await pool.close()
    app = local_app(config)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("5")
        pane = app.screen.query_one(RunsPane)
        table = pane.query_one(RunTable)
        await wait_for(pilot, lambda: table.ids == [run.id], 60, "the run listed")
        line = pane.query_one("#runs-activity", Static)
        table.focus()
        sshd.stop()
        try:
            await pilot.press("x")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "confirm")
            await pilot.press("y")
            await wait_for(pilot, lambda: "stop failed" in str(line.render()), 60, "failure")
            said = str(line.render())
            assert "gpu: could not be reached" in said and "no run" not in said, said
        finally:
            sshd.restart()
        await wait_for(pilot, lambda: "gpu is reachable again" in str(line.render()), 60,
                       "the host answering again")
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "confirm")
        await pilot.press("y")
        await wait_for(pilot, lambda: f"{run.id}: stopped" in str(line.render()), 60, "stopped")
