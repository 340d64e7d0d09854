"""End to end through the real app on the real test sshd and the real demo workspace: `p` pushes
a sync set, `t` launches a short demo finetune (pushing the edited script first), the SSH
connection is dropped while the run trains and the run detail catches up with every step exactly
once, the plots hold the metrics, and the run's final checkpoint appears in the checkpoints pane
and inspects clean."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from console.app import create_app
from console.demo.config import demo_profiles
from console.hosts.host import HostPool
from console.monitor.service import MonitorHub
from console.panes.checkpoints import CheckpointsPane, CheckpointTable
from console.panes.runs import RunsPane
from console.screens.main import MainScreen
from console.screens.run_detail import RunDetailScreen
from console.settings.config import Config, HostConfig, SyncSet
from console.widgets.inspect_view import InspectView
from console.widgets.line_plot import LinePlot
from console.widgets.run_tables import RunTable
from engine import events
from tests.sshd import SSHD
from tests.waiting import wait_for

pytest_plugins = ("tests.demo_workspace",)

STEPS = 40  # long enough that the connection drops mid-run (8 steps once all arrived before it)


def main_screen(pilot: Pilot[Any]) -> MainScreen:
    return next(s for s in pilot.app.screen_stack if isinstance(s, MainScreen))


@pytest.mark.slow
@pytest.mark.sshd
async def test_push_launch_drop_watch_and_inspect(sshd: SSHD, demo_dir: Path,
                                                  tmp_path: Path) -> None:
    scripts = tmp_path / "my-scripts"
    scripts.mkdir()
    (scripts / "04_train.py").write_text("print('my training script')\n")
    (scripts / "notes.md").write_text("finetune notes\n")
    root = tmp_path / "remote root"
    host = HostConfig(name="gpu", ssh=sshd.target, known_hosts=str(sshd.known_hosts),
                      identity=str(sshd.user_key), python=sys.executable, root=str(root),
                      checkpoints=[str(demo_dir / "public-drafter")])
    profiles = demo_profiles(str(demo_dir), host="gpu", steps=STEPS,
                             extra=["--save-every", "0", "--holdout", "4"])
    profiles["finetune"].sync = ["scripts"]
    profiles["finetune"].env = {"OMP_NUM_THREADS": "1"}
    config = Config(hosts={"gpu": host}, profiles=profiles,
                    syncs={"scripts": SyncSet("scripts", "gpu", str(scripts),
                                              str(root / "scripts"))})
    app = create_app(config, host="gpu", monitors=MonitorHub(HostPool(config), autostart=False))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("5")
        pane = main_screen(pilot).query_one(RunsPane)
        await wait_for(pilot, lambda: pane.model.listed > 0, 120, "the run registry")
        activity = pane.query_one("#runs-activity")

        # p: the sync set goes over (the engine went with the first registry read)
        await pilot.press("p")
        await wait_for(pilot, lambda: pane.model.busy is None and "files" in str(activity.render()),
                       120, "push")
        text = str(activity.render())
        assert text.startswith("pushed 2 of ") and "scripts 2/2" in text, text
        assert (root / "scripts" / "04_train.py").read_text() == "print('my training script')\n"

        # t: an edited script is pushed first, then the finetune starts detached
        (scripts / "04_train.py").write_text("print('edited')\n")
        await pilot.press("t")
        table = pane.query_one(RunTable)
        await wait_for(pilot, lambda: pane.model.busy is None and table.selected is not None and
                       f"started {table.selected}" in str(activity.render()), 180, "launch")
        assert "scripts 1/2" in str(activity.render())
        assert (root / "scripts" / "04_train.py").read_text() == "print('edited')\n"
        run_id = table.selected
        assert run_id is not None and run_id.startswith("finetune-")

        # enter: the run detail; drop the SSH connection once the first metrics are in
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, RunDetailScreen), 30,
                       "run detail")
        detail = pilot.app.screen
        assert isinstance(detail, RunDetailScreen)
        feed = detail.feed
        steps: list[int] = []
        original = feed.progress._metric

        def spy(ev: events.Metric) -> None:
            steps.append(int(ev.step or 0))
            original(ev)

        feed.progress._metric = spy  # type: ignore[method-assign]
        await wait_for(pilot, lambda: feed.progress.last_step is not None, 240, "first metric")
        at_drop = feed.progress.last_step or 0
        assert sshd.drop_connections() >= 1
        await wait_for(pilot, lambda: feed.finished, 300, "the run to end")
        assert feed.status == "succeeded", feed.record.to_json()
        # every step once: what came before the drop plus what was caught up after it
        seen = list(range(1, (steps[0] if steps else 1))) + steps
        assert sorted(set(seen)) == list(range(1, STEPS + 1)) and len(steps) == len(set(steps))
        assert feed.progress.done == STEPS and feed.progress.result is not None
        assert at_drop < STEPS      # the rest came over the new connection
        detail.refresh_view(force=True)
        await pilot.pause()
        plots = {p.id: p for p in detail.query(LinePlot)}
        assert plots["plot-loss"].point_count == STEPS
        # every step's training-batch estimate, and the held-out figure of each checkpoint
        train_tau, held_out = (pts for _, pts in plots["plot-tau"].series)
        assert len(train_tau) == STEPS and held_out and held_out[-1][0] == STEPS
        assert len(plots["plot-acc"].series) == 4      # acc_0..acc_3 (--ttt-steps 4)
        prov = dict(feed.provenance())
        assert prov["finetune"].startswith(str(demo_dir / "public-drafter"))
        assert "manifest" in prov["code"]

        # its final checkpoint, in the checkpoints pane, inspects clean
        await pilot.press("escape")
        await pilot.press("6")
        ck = main_screen(pilot).query_one(CheckpointsPane)
        final = str(root / "runs" / run_id / "out" / "final")
        ctable = ck.query_one(CheckpointTable)
        await wait_for(pilot, lambda: final in ctable.paths, 60, "the final checkpoint listed")
        assert str(demo_dir / "public-drafter") in ctable.paths
        ctable.select(final)
        view = ck.query_one(InspectView)
        await wait_for(pilot, lambda: view.report is not None and view.heading == final, 120,
                       "its inspect report")
        assert view.report is not None and view.report.ok, view.plain
        assert view.report.format == "eagle"
