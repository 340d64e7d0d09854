"""A key that cannot do anything says why: `p` on a host without profiles keeps its outcome on
the activity line (the "no profile runs here" hint wrote over it a moment later) and in a toast,
`[` / `]` with one host, `i` on an empty Checkpoints pane."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from textual.widgets import Static

from tests.runs_registry import local_app, local_config
from tests.waiting import wait_for

OUTCOME = " to local (engine "   # what push_summary says of either outcome


def notes(app: Any) -> list[str]:
    return [n.message for n in app._notifications]


async def test_push_on_a_host_without_profiles_says_what_it_did() -> None:
    cfg = local_config(Path(tempfile.mkdtemp(prefix="eagle3-console-push-")))
    cfg.profiles.clear()
    app = local_app(cfg)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("5")
        pane = app.screen.query_one("#pane-runs")
        activity = pane.query_one("#runs-activity", Static)
        await wait_for(pilot, lambda: "No profile runs" in str(activity.render()))
        await pilot.press("p")
        # "pushed N of M files …" or, where the pane's registry read pushed the engine first,
        # "up to date: 0 of M files sent …"
        await wait_for(pilot, lambda: pane.model.busy is None
                       and OUTCOME in str(activity.render()), 120, "the push",
                       lambda: (pane.model.busy, str(activity.render()), notes(app)))
        for _ in range(3):           # the pane's redraws and its next registry read
            pane.load_runs("local")
            await pilot.pause(0.3)
            pane.refresh_view(force=True)
        assert OUTCOME in str(activity.render()), activity.render()
        assert any(OUTCOME in n for n in notes(app)), notes(app)


async def test_switching_hosts_with_one_host_says_there_is_one() -> None:
    app = local_app(local_config(Path(tempfile.mkdtemp(prefix="eagle3-console-hosts-"))))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("]")
        await pilot.pause()
        assert any("only configured host" in n for n in notes(app)), notes(app)


async def test_inspect_with_no_checkpoint_says_so() -> None:
    app = local_app(local_config(Path(tempfile.mkdtemp(prefix="eagle3-console-ckpt-"))))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("6")
        pane = app.screen.query_one("#pane-checkpoints")
        await wait_for(pilot, lambda: pane.scans > 0)
        await pilot.press("i")
        await pilot.pause()
        assert any("No checkpoint selected" in n for n in notes(app)), notes(app)
