"""Regenerate the README's screenshots (docs/screenshot*.svg) from the real app: `make screenshots`.

In a scratch data directory (`--work`, default /tmp/eagle3-screenshots) the demo workspace is
built (the first time: about a minute on 2 cores), the demo finetune is launched on the local host
and run to its end (about 15 s), then the app is driven with Pilot: the Runs pane with the
finished run (docs/screenshot-runs.svg), its run detail (docs/screenshot.svg), and the
comparison of two serving sessions (docs/screenshot-compare.svg). The demo has no vLLM, so the
comparison's two sessions, the demo's public drafter and the finetune's out/final, carry
recorded example figures (those of tests/console/checkpoints/test_compare.py's snapshot).
Nothing of the user's is read or written: the config, data and run directories are all under
--work."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

# the console reads its data and config directories when asked, not at import (main sets them)
from console.app import Eagle3App, create_app
from console.checkpoints.journal import (
    Figures,
    Scrape,
    Session,
    record,
    results_path,
    sessions_path,
)
from console.checkpoints.serve import session_provenance
from console.checkpoints.service import inspect_checkpoint
from console.demo.build import ensure_demo
from console.demo.config import console_config, refresh_demo_profiles
from console.dialogs.compare import CompareScreen
from console.hosts.host import HostPool
from console.monitor.service import MonitorHub
from console.panes.runs import RunsPane
from console.runs.service import launch, list_runs
from console.scheduler.run_status import RunStatus
from console.screens.run_detail import RunDetailScreen
from console.settings.config import LOCAL, Config
from console.widgets.run_tables import RunTable

DOCS = Path(__file__).resolve().parent
RUN_TIMEOUT_S = 1800.0   # a first demo build on a loaded machine, then 150 steps
WAIT_S = 120.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default="/tmp/eagle3-screenshots", help="the scratch directory")
    p.add_argument("--out", default=str(DOCS), help="where the SVGs go (default: docs/)")
    args = p.parse_args()
    work = Path(args.work).resolve()
    # before the console is imported: its data and config directories come from these
    os.environ["XDG_DATA_HOME"] = str(work / "data")
    os.environ["XDG_CONFIG_HOME"] = str(work / "config")
    asyncio.run(shoot(Path(args.out)))
    return 0


async def until(pilot: Pilot[Any], cond: Callable[[], object], what: str) -> None:
    """Let the app run until cond() holds (WAIT_S at most)."""
    deadline = time.monotonic() + WAIT_S
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"error: timed out waiting for {what}")
        await pilot.pause(0.1)


async def finished_demo_run(config: Config) -> str:
    """Build the demo workspace (unless there), launch its finetune, wait for it to end."""
    assert config.demo is not None
    async with HostPool(config) as pool:
        host = await pool.ensure(LOCAL)
        print(f"building the demo workspace in {config.demo} (unless built)", file=sys.stderr)
        await ensure_demo(host, config.demo)
        refresh_demo_profiles(config)
        run = await launch(config, "finetune", pool)
        print(f"launched {run.id}: waiting for it to end", file=sys.stderr)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while True:
            recs = await list_runs(host, run.id)
            if recs and not recs[0].status.active:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"error: {run.id} did not end in {RUN_TIMEOUT_S:.0f} s")
            await asyncio.sleep(1.0)
        if recs[0].status != RunStatus.SUCCEEDED:
            raise SystemExit(f"error: {run.id} {recs[0].status}: {recs[0].failure}")
        return run.id


async def record_two_sessions(config: Config, run_dir: str) -> None:
    """The public drafter, then the finetune's out/final, served 10 minutes each: each session
    with the provenance `serve` records (the drafter inspected on the host), example figures."""
    assert config.demo is not None
    url, t0 = "http://127.0.0.1:8000/metrics", time.time() - 1800
    public, final = f"{config.demo}/public-drafter", f"{run_dir}/out/final"
    async with HostPool(config) as pool:
        host = await pool.ensure(LOCAL)
        for i, (drafter, accepted, pos, tps) in enumerate((
                (public, 2520, [0.62, 0.41, 0.23], 812.5),
                (final, 3880, [0.87, 0.63, 0.44], 1093.0))):
            prov = session_provenance(await inspect_checkpoint(host, drafter))
            sid = f"serve-example-{i}"
            record(Session(run_id=sid, host=LOCAL, drafter=drafter, verifier="", k=3, port=None,
                           metrics=url, started=t0 + 900 * i, swappable=False,
                           provenance=prov))
            record(Scrape(run_id=sid, host=LOCAL, url=url, t=t0 + 900 * i + 600,
                          total=Figures(drafts=2000, accepted=accepted,
                                        acceptance_length=1 + accepted / 2000,
                                        per_position=tuple(pos),
                                        generation_tokens_per_s=tps, seconds=600.0)))


async def shoot(out: Path) -> None:
    config = console_config(None)
    # one run and two serving sessions, whatever an earlier call left
    shutil.rmtree(Path(config.host(LOCAL).root) / "runs", ignore_errors=True)
    for p in (sessions_path(), results_path()):
        p.unlink(missing_ok=True)
    run_id = await finished_demo_run(config)
    out.mkdir(parents=True, exist_ok=True)

    def app() -> Eagle3App:
        return create_app(config, monitors=MonitorHub(HostPool(config), autostart=False))

    main = app()
    async with main.run_test(size=(120, 40)) as pilot:
        await pilot.press("5")
        pane = main.screen.query_one(RunsPane)
        table = main.screen.query_one(RunTable)
        await until(pilot, lambda: table.ids == [run_id] and table.rows_shown[0][2] == "150/150",
                    "the runs table")
        pane.refresh_view(force=True)
        await pilot.pause()
        main.save_screenshot("screenshot-runs.svg", str(out))
        table.focus()
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(main.screen, RunDetailScreen)
                    and (f := pane.model.feeds.find(LOCAL, run_id)) is not None
                    and f.finished and f.train_run is not None, "the run detail")
        detail = main.screen
        assert isinstance(detail, RunDetailScreen)
        detail.refresh_view(force=True)
        await pilot.pause()
        main.save_screenshot("screenshot.svg", str(out))

    await record_two_sessions(config, str(Path(config.host(LOCAL).root) / "runs" / run_id))
    compare = app()
    async with compare.run_test(size=(140, 36)) as pilot:
        screen = CompareScreen(measure=False)
        compare.push_screen(screen)
        await until(pilot, lambda: len(screen.rows) == 2, "the comparison")
        await pilot.pause()
        compare.save_screenshot("screenshot-compare.svg", str(out))
    print(f"wrote {out}/screenshot.svg, screenshot-runs.svg, screenshot-compare.svg",
          file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
