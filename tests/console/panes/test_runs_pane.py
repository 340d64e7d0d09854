"""The runs pane and run detail on a real registry on disk with a recorded event stream (a real
demo finetune) at a frozen clock: SVG snapshots of a running and a finished run at 120x40; the
run feed catching up by byte offset with no gap or repeat across a cancel; bounded series; the
plot; help, palette and footer built from the bindings; the layout at 100x30."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Footer, Static, TabbedContent

from console.cli import main as cli_main
from console.hosts.host import Host
from console.panes.runs import RunsPane
from console.runs.progress import MAX_POINTS, RunProgress, Series
from console.runs.service import list_runs
from console.runs.watch import RunFeed
from console.screens.main import PANES, MainScreen
from console.screens.run_detail import RunDetailScreen
from console.settings.config import HostConfig, Profile
from console.ui.keymap import KEYS
from console.widgets.host_list import HostList
from console.widgets.line_plot import LinePlot, braille_grid
from console.widgets.run_tables import RUN_COLUMNS, RUN_WIDTH, ProfileTable, RunTable
from engine import events
from tests.panes import FINISHED, RUNNING, feed_of, runs_pane, show_runs, two_runs
from tests.replay import FrozenClock
from tests.runs_registry import (
    FIXTURES,
    event_time,
    local_app,
    local_config,
    recorded_events,
    upto_step,
    write_run,
)
from tests.waiting import wait_for

SIZE = (120, 40)
pytestmark = pytest.mark.usefixtures("utc")   # times on screen are local times
def test_snapshot_runs_pane_running_and_finished(snap_compare: Any) -> None:
    root, clock = two_runs("runs-pane")
    n = len(upto_step(recorded_events(), 60))

    async def run_before(pilot: Pilot[Any]) -> None:
        await show_runs(pilot, n)

    assert snap_compare(local_app(local_config(root), clock), terminal_size=SIZE,
                        run_before=run_before)


LONG_FAILED = "serve-finetune-20261130-140141-0f0f-final-20261130-180000-abcd"


def test_snapshot_runs_pane_80x24_with_a_long_named_failed_run(snap_compare: Any) -> None:
    """A refused serve (exit 127) with a 62-character id: its name is cut in the middle and
    every column stays where it is; at 80 columns every column up to ELAPSED is on screen."""
    root, clock = two_runs("runs-pane-80x24")
    run_dir = write_run(root, LONG_FAILED, [], status="failed", start=clock() - 60,
                        end=clock() - 59, exit_code=127, train_json=False)
    rec = json.loads((run_dir / "run.json").read_text())
    rec.update(engine=False, argv=["vllm", "serve", "/data/demo/target"])
    (run_dir / "run.json").write_text(json.dumps(rec))
    n = len(upto_step(recorded_events(), 60))

    async def run_before(pilot: Pilot[Any]) -> None:
        await show_runs(pilot, n)
        table = pilot.app.screen.query_one(RunTable)
        # the finished run's progress is read once: wait for it, so what is drawn is settled
        await wait_for(pilot, lambda: table.rows_shown[2][2] == "150/150")
        runs_pane(pilot).refresh_view(force=True)
        await pilot.pause()
        assert table.ids[0] == LONG_FAILED
        assert table.rows_shown[0][0] == "serve-finetune-20…180000-abcd"
        assert all(len(row[0]) <= RUN_WIDTH for row in table.rows_shown)
        # RUN, STATUS, PROGRESS, HELD-OUT and ELAPSED end inside the table's width
        shown = RUN_COLUMNS.index("ELAPSED") + 1
        end = sum(c.get_render_width(table) for c in list(table.columns.values())[:shown])
        assert end <= table.size.width, (end, table.size.width)

    assert snap_compare(local_app(local_config(root), clock), terminal_size=(80, 24),
                        run_before=run_before)


def test_snapshot_run_detail_running(snap_compare: Any) -> None:
    """Step 60 of 150: progress with ETA, loss / tau / acc_i plots, log lines, provenance."""
    root, clock = two_runs("run-detail-running")
    n = len(upto_step(recorded_events(), 60))

    async def run_before(pilot: Pilot[Any]) -> None:
        await show_runs(pilot, n)
        await pilot.press("enter")          # on the finetune profile: its newest run
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, RunDetailScreen))
        pilot.app.screen.refresh_view(force=True)
        await pilot.pause()

    assert snap_compare(local_app(local_config(root), clock), terminal_size=SIZE,
                        run_before=run_before)


def test_snapshot_run_detail_finished(snap_compare: Any) -> None:
    root, clock = two_runs("run-detail-finished")
    n = len(upto_step(recorded_events(), 60))
    total = len(recorded_events())

    async def run_before(pilot: Pilot[Any]) -> None:
        await show_runs(pilot, n)
        pilot.app.screen.query_one(RunTable).focus()
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: (f := feed_of(pilot, FINISHED)) is not None
                       and f.finished and f.progress.events == total)
        pilot.app.screen.refresh_view(force=True)
        await pilot.pause()

    assert snap_compare(local_app(local_config(root), clock), terminal_size=SIZE,
                        run_before=run_before)


async def test_pane_rows_and_detail_state() -> None:
    root, clock = two_runs("runs-pane-state")
    lines = recorded_events()
    app = local_app(local_config(root), clock)
    async with app.run_test(size=SIZE) as pilot:
        await show_runs(pilot, len(upto_step(lines, 60)))
        table = app.screen.query_one(RunTable)
        assert table.ids == [RUNNING, FINISHED]                      # newest first
        running, finished = (dict(zip(RUN_COLUMNS, r, strict=True)) for r in table.rows_shown)
        assert running["STATUS"] == "▶ running" and running["PROGRESS"].startswith("60/150 ")
        assert finished["STATUS"] == "✔ succeeded" and finished["ELAPSED"] == "2:21"
        # the finished run's best held-out figure and step (out/best), none yet for the other
        assert (finished["HELD-OUT"], running["HELD-OUT"]) == ("3.44@150", "-")
        # a new console (fresh feeds): the finished run's progress is read once, not `-`
        await wait_for(pilot, lambda: table.rows_shown[1][2] == "150/150")
        assert running["CODE"].startswith("5b4def2d 6d60b61")     # manifest, then git
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RunDetailScreen))
        screen = app.screen
        assert isinstance(screen, RunDetailScreen)
        plots = {p.id: p for p in screen.query(LinePlot)}
        assert [len(pts) for _, pts in plots["plot-loss"].series] == [60]
        assert [name for name, _ in plots["plot-acc"].series] == [f"acc_{i}" for i in range(4)]
        # the training-batch estimate at every step, and step 50's held-out measurement
        assert [len(pts) for _, pts in plots["plot-tau"].series] == [60, 1]
        prov = dict(screen.feed.provenance())
        assert prov["finetune"].startswith("/data/demo/public-drafter (eagle, sha256 ")
        assert prov["data"].startswith("/data/demo/data (sha256 5610ec719eb3")
        assert prov["vocab"].startswith("rebuilt from data (sha256 fcd6e9655d2a")
        assert prov["code"] == "manifest 5b4def2dcfb1 · engine 0.1.0"
        # at 120x40 every row shows (with room for `final`), each within the box's width,
        # and the hashes are not the part that is cut
        box = screen.query_one("#detail-prov", Static)
        await wait_for(pilot, lambda: box.content_size.width > 0)
        screen.refresh_view(force=True)
        shown = box.render().plain.splitlines()  # type: ignore[union-attr]
        assert len(shown) == len(prov) and box.content_size.height >= len(prov) + 1
        assert all(len(line) <= box.content_size.width for line in shown), shown
        assert [line.split()[0] for line in shown] == list(prov)
        for sha in ("6bed35ef9908", "5610ec719eb3", "fcd6e9655d2a"):
            assert sha in box.render().plain  # type: ignore[union-attr]
        await pilot.press("escape")
        assert isinstance(app.screen, MainScreen)


async def test_feed_catches_up_without_gap_or_repeat_across_a_cancel(tmp_path: Path) -> None:
    """Follow, cancel mid-run (screen closed, console gone), more lines land, follow again:
    every step arrives exactly once, and the feed ends when the registry says the run ended."""
    lines = recorded_events()
    first = upto_step(lines, 40)
    run_dir = write_run(tmp_path, RUNNING, first, status="running", start=time.time())
    config = local_config(tmp_path)
    host = Host(config.hosts["local"])
    rec = (await list_runs(host, RUNNING))[0]
    assert rec.status == "running"
    feed = RunFeed(host, rec, poll=0.05, status_every=0.1)
    steps: list[int] = []
    original = feed.progress._metric

    def spy(ev: events.Metric) -> None:
        steps.append(int(ev.step or 0))
        original(ev)

    feed.progress._metric = spy  # type: ignore[method-assign]
    task = asyncio.ensure_future(feed.follow())
    deadline = time.monotonic() + 30
    while len(steps) < 40:
        assert time.monotonic() < deadline, steps[-3:]
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with open(run_dir / "events.jsonl", "a", encoding="utf-8") as f:
        half = lines[len(first):len(first) + 50]
        f.write("".join(ln + "\n" for ln in half))
        f.write(lines[len(first) + 50][:40])        # a line still being written
    task = asyncio.ensure_future(feed.follow())
    while len(steps) < 65:
        assert time.monotonic() < deadline + 30
        await asyncio.sleep(0.05)
    with open(run_dir / "events.jsonl", "a", encoding="utf-8") as f:
        f.write(lines[len(first) + 50][40:] + "\n")
        f.write("".join(ln + "\n" for ln in lines[len(first) + 51:]))
    rec_json = json.loads((run_dir / "run.json").read_text())
    rec_json.update(status="succeeded", exit_code=0, end=time.time())
    (run_dir / "run.json").write_text(json.dumps(rec_json))
    await asyncio.wait_for(task, 60)
    assert steps == list(range(1, 151))
    assert feed.finished and feed.status == "succeeded"
    assert feed.progress.result is not None and feed.progress.done == 150
    await host.close()


async def test_feed_shows_provenance_when_the_run_writes_it(tmp_path: Path) -> None:
    """Watched from launch: the training run's run.json appears after following started; the
    feed reads it then, while the run is still running (not only when it ends)."""
    lines = recorded_events()
    run_dir = write_run(tmp_path, RUNNING, upto_step(lines, 5), status="running",
                        start=time.time(), train_json=False)
    host = Host(local_config(tmp_path).hosts["local"])
    rec = (await list_runs(host, RUNNING))[0]
    feed = RunFeed(host, rec, poll=0.05, status_every=0.1)
    task = asyncio.ensure_future(feed.follow())
    try:
        deadline = time.monotonic() + 30
        while feed.progress.done != 5:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert feed.train_run is None and "finetune" not in dict(feed.provenance())
        shutil.copy(FIXTURES / "finetune.run.json", run_dir / "out" / "run.json")
        while feed.train_run is None:
            assert time.monotonic() < deadline, "run.json never read while following"
            await asyncio.sleep(0.05)
        assert feed.following and feed.status == "running"
        prov = dict(feed.provenance())
        assert {"finetune", "remap", "target", "data", "vocab"} <= set(prov)
    finally:
        task.cancel()
        await host.close()


async def test_feed_of_a_pending_job_waits_for_it_to_start_and_end(tmp_path: Path) -> None:
    """A Slurm job still pending has no output yet: the feed (and the follow subcommand, which
    asks the same `ended`) keeps asking the registry instead of calling the run over."""
    lines = recorded_events()
    run_dir = write_run(tmp_path, RUNNING, [], status="pending", start=time.time(),
                        train_json=False)
    host = Host(local_config(tmp_path).hosts["local"])
    rec = (await list_runs(host, RUNNING))[0]
    assert rec.status == "pending"
    feed = RunFeed(host, rec, poll=0.05, status_every=0.1)
    task = asyncio.ensure_future(feed.follow())
    try:
        watched = time.monotonic() + 0.8        # several registry checks, each still pending
        while time.monotonic() < watched:
            assert not task.done(), "the feed called a pending job over"
            await asyncio.sleep(0.05)
        (run_dir / "events.jsonl").write_text("".join(ln + "\n" for ln in lines))
        rec_json = json.loads((run_dir / "run.json").read_text())
        rec_json.update(status="succeeded", exit_code=0, end=time.time())
        (run_dir / "run.json").write_text(json.dumps(rec_json))
        await asyncio.wait_for(task, 60)
        assert feed.finished and feed.status == "succeeded" and feed.progress.done == 150
    finally:
        task.cancel()
        await host.close()


def test_series_stay_bounded_and_keep_the_whole_run_in_view() -> None:
    s = Series()
    n = MAX_POINTS * 10 + 7
    for i in range(n):
        s.add(float(i), float(i) * 2)
    assert len(s.points) <= MAX_POINTS
    assert s.points[0] == (0.0, 0.0)                  # the start stays
    view = s.view()
    assert view[-1] == (float(n - 1), float(n - 1) * 2)  # and so does the latest point
    xs = [x for x, _ in view]
    assert xs == sorted(xs) and xs[-1] - xs[0] == n - 1


def test_progress_reads_the_recorded_stream() -> None:
    p = RunProgress()
    lines = recorded_events()
    for ln in lines:
        p.ingest_event_line(ln)
    p.ingest_event_line("a stray line of output")
    assert (p.done, p.total, p.unit) == (150, 150, "step")
    assert len(p.points("loss")) == 150 and p.acc_names() == ["acc_0", "acc_1", "acc_2", "acc_3"]
    assert p.points("tau")[-1][1] > p.points("tau")[0][1]    # the finetune got better
    assert p.result is not None and p.result["steps"] == 150
    assert any(ln.level == "out" and "stray" in ln.text for ln in p.lines)
    assert not any(name.startswith(("lr", "grad")) for name in p.series)  # plotted ones only


def test_braille_grid_draws_a_joined_line() -> None:
    grid = braille_grid([[(0.0, 0.0), (1.0, 1.0)]], 4, 2, (0.0, 1.0), (0.0, 1.0))
    # a diagonal from bottom-left to top-right touches every column, both rows
    assert all(any(grid[r][c][0] for r in range(2)) for c in range(4))
    assert grid[1][0][0] and grid[0][3][0] and not grid[0][0][0] and not grid[1][3][0]
    assert {k for row in grid for bits, k in row if bits} == {0}


async def test_palette_footer_and_layout_at_100x30(tmp_path: Path) -> None:
    root, clock = tmp_path / "root", FrozenClock()
    app = local_app(local_config(root), clock)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("5")
        pane = app.screen.query_one(RunsPane)
        await wait_for(pilot, lambda: pane.model.listed > 0)
        # the footer shows the focused pane's keys
        footer_keys = {b.key for _n, b, _e, _d in app.screen.active_bindings.values()
                       if b.show} if hasattr(app.screen, "active_bindings") else set()
        assert {"p", "t", "x", "r", "enter"} <= footer_keys
        assert app.screen.query_one(Footer).display
        # every pane action is a palette command, and running one acts like the key
        from console.ui.palette import ConsoleCommands
        assert ConsoleCommands in app.COMMANDS   # set once, on the app
        provider = ConsoleCommands(app.screen)
        names = [name for name, _h, _cb in provider.commands()]
        for tab_id, title, _cls in PANES:
            for k in KEYS:
                if k.section == tab_id and k.bound and k.palette:
                    assert f"{title}: {k.label}" in names
        assert "GPUs: Sort" in names and "Checkpoints: Serve" in names
        assert "Help: all keys" in names
        show_ckpt = next(cb for name, _h, cb in provider.commands() if name == "Show Checkpoints")
        show_ckpt()
        await pilot.pause()
        assert app.screen.query_one(TabbedContent).active == "tab-checkpoints"
        # the layout fits: tables and status inside the pane, nothing with zero size
        await pilot.press("5")
        await pilot.pause()
        for w in (pane.query_one("#profiles-table"), pane.query_one(RunTable),
                  pane.query_one("#runs-status")):
            assert w.size.width >= 60 and w.size.height >= 1, w
        assert pane.query_one(RunTable).region.bottom <= 29
        await pilot.press("question_mark")
        await pilot.pause()
        assert type(app.screen).__name__ == "HelpScreen"
        await pilot.press("escape")
        assert app.screen.query_one(RunsPane) is pane


async def test_t_keeps_the_profile_cursor_and_says_what_it_launches(tmp_path: Path) -> None:
    """After t the profile cursor and focus stay where the user put them (a second t or Up
    means that profile), and the status line names the profile t starts."""
    root = tmp_path / "root"
    config = local_config(root)
    config.profiles = {n: Profile(n, ["local"], "true") for n in ("first", "second")}
    app = local_app(config)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        pane = app.screen.query_one(RunsPane)
        await wait_for(pilot, lambda: pane.model.listed > 0)
        profiles = pane.query_one(ProfileTable)
        profiles.focus()
        await pilot.press("down")
        await pilot.pause()
        status = pane.query_one("#runs-status", Static)
        assert "t launches second" in str(status.render())
        await pilot.press("t")
        await wait_for(pilot, lambda: pane.model.busy is None and
                       len(pane.model.records.get("local", []))
                       == 1)
        await pilot.pause()
        assert app.focused is profiles and profiles.selected == "second"
        assert "2 profiles · 1 run · " in str(status.render())   # not "1 runs"
        assert pane.model.records["local"][0].profile == "second"
        assert pane.query_one(RunTable).selected == pane.model.records["local"][0].id
        assert "t launches second" in str(status.render())


def order_runs(root: Path) -> list[str]:
    """Three runs whose ids sort by profile, not by time; the ids newest first."""
    lines = recorded_events()
    t0 = event_time(lines[0])
    starts = {"alpha-20261130-100000-aaaa": t0 + 300, "beta-20261130-100000-bbbb": t0 + 100,
              "gamma-20261130-100000-cccc": t0 + 200}
    for rid, start in starts.items():
        write_run(root, rid, lines, status="succeeded", start=start, end=start + 60,
                  exit_code=0)
    return sorted(starts, key=lambda r: -starts[r])


def test_runs_host_lists_newest_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    newest = order_runs(tmp_path)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.box]\npython = "{sys.executable}"\nroot = "{tmp_path}"\n')
    assert cli_main(["--config", str(cfg), "runs", "box"]) == 0
    out = capsys.readouterr().out.splitlines()[1:]
    assert [line.split()[0] for line in out] == newest


async def test_the_runs_pane_lists_newest_first(tmp_path: Path) -> None:
    newest = order_runs(tmp_path)
    app = local_app(local_config(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        pane = app.screen.query_one(RunsPane)
        await wait_for(pilot, lambda: pane.model.listed > 0)
        await pilot.pause()
        assert pane.query_one(RunTable).ids == newest


async def test_no_profiles_with_a_config_file_says_the_demo_is_hidden(tmp_path: Path) -> None:
    config = local_config(tmp_path)
    config.profiles, config.path = {}, tmp_path / "config.toml"
    app = local_app(config)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        pane = app.screen.query_one(RunsPane)
        await wait_for(pilot, lambda: pane.model.listed > 0)
        text = str(pane.query_one("#runs-activity", Static).render())
        assert "demo profiles hidden: your config defines hosts" in text


async def test_switching_to_a_host_with_profiles_drops_the_no_profile_message(
        tmp_path: Path) -> None:
    """Two hosts of this machine: `bare` runs no profile, `local` runs the demo's. The hint
    `No profile runs on this host … host = "bare"` belongs to `bare` alone: after switching to
    `local` (and after `r`) it is gone, and it comes back, naming `bare`, on the way back."""
    config = local_config(tmp_path / "local")
    config.hosts = {"bare": HostConfig(name="bare", python=sys.executable,
                                       root=str(tmp_path / "bare")), **config.hosts}
    config.path = tmp_path / "config.toml"
    app = local_app(config)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        pane = app.screen.query_one(RunsPane)
        await wait_for(pilot, lambda: pane.host == "bare" and pane.model.listed > 0)
        activity = pane.query_one("#runs-activity", Static)
        assert 'host = "bare"' in str(activity.render())
        hosts = app.screen.query_one(HostList)
        hosts.focus()
        await pilot.press("down")
        await wait_for(pilot, lambda: pane.host == "local" and pane.model.listed > 1)
        await pilot.pause()
        assert "No profile runs" not in str(activity.render())
        pane.query_one(ProfileTable).focus()
        await pilot.press("r")
        await wait_for(pilot, lambda: pane.model.listed > 2)
        await pilot.pause()
        assert "No profile runs" not in str(activity.render())
        assert "t launches finetune" in str(pane.query_one("#runs-status", Static).render())
        hosts.focus()
        await pilot.press("up")
        await wait_for(pilot, lambda: pane.host == "bare" and pane.model.listed > 3)
        await pilot.pause()
        assert 'host = "bare"' in str(activity.render())


class _Forwarder:
    """A loopback port that refuses connections until `open()`, then forwards them to sshd:
    a host that is down, then back."""

    def __init__(self, target: int) -> None:
        import socket as sock
        with sock.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.target = target
        self.server: asyncio.Server | None = None

    async def open(self) -> None:
        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except OSError:
                pass
            finally:
                w.close()

        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            tr, tw = await asyncio.open_connection("127.0.0.1", self.target)
            await asyncio.gather(pipe(r, tw), pipe(tr, w))

        self.server = await asyncio.start_server(serve, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


@pytest.mark.sshd
async def test_an_unreachable_host_is_said_so_and_its_failure_clears_when_it_is_back(
        sshd: Any, tmp_path: Path) -> None:
    """The Runs pane of a host that is down said `0 runs` (the registry could not be read);
    `launch … failed: cannot reach` stayed on the activity line minutes after the host came
    back. Now: `runs: cannot reach gpu9`, and the failure goes with the first good read."""
    fwd = _Forwarder(sshd.port)
    known = tmp_path / "known_hosts"
    key = sshd.known_hosts.read_text().split(None, 1)[1]
    known.write_text(f"[127.0.0.1]:{fwd.port} {key}")
    host = HostConfig(name="gpu9", ssh=f"{sshd.user}@127.0.0.1:{fwd.port}",
                      known_hosts=str(known), identity=str(sshd.user_key),
                      python=sys.executable, root=str(tmp_path / "root"))
    config = local_config(tmp_path / "local")
    config.hosts = {"gpu9": host}
    config.profiles = {"job": Profile("job", ["gpu9"], "true")}
    app = local_app(config)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("5")
            pane = runs_pane(pilot)
            status = pane.query_one("#runs-status", Static)
            await wait_for(pilot, lambda: "gpu9" in pane.model.list_error, 30, "a failed read")
            pane.refresh_view(force=True)
            await pilot.pause()
            shown = str(status.render())
            assert "runs: cannot reach gpu9" in shown and "0 runs" not in shown, shown
            await pilot.press("t")
            activity = pane.query_one("#runs-activity", Static)
            await wait_for(pilot, lambda: "failed" in str(activity.render()), 30, "launch")
            assert "launch of job failed" in str(activity.render())
            await fwd.open()                          # the host is back
            await pilot.press("r")
            await wait_for(pilot, lambda: pane.model.listed_on("gpu9"), 60, "a good read")
            await wait_for(pilot, lambda: "failed" not in str(activity.render()), 10,
                           "the failure to go")
            assert "gpu9 is reachable again" in str(activity.render())
            pane.refresh_view(force=True)
            await pilot.pause()
            shown = str(status.render())
            assert "0 runs" in shown and "cannot" not in shown, shown
    finally:
        await fwd.close()


async def test_runs_say_listing_until_the_first_read_is_in(tmp_path: Path) -> None:
    """On a start, the registry read takes a moment: the pane said `0 runs` before listing a
    running run; it says it is listing (a host whose Python answers after a second here)."""
    slow = tmp_path / "slow-python"
    slow.write_text(f"#!/bin/sh\nsleep 1.5\nexec {sys.executable} \"$@\"\n")
    slow.chmod(0o755)
    root, clock = two_runs("listing")
    config = local_config(root)
    config.hosts["local"].python = str(slow)
    app = local_app(config, clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("5")
        pane = runs_pane(pilot)
        status = pane.query_one("#runs-status", Static)
        pane.refresh_view(force=True)
        await pilot.pause()
        first = str(status.render())
        await wait_for(pilot, lambda: pane.model.listed > 0, 30, "the listing")
        pane.refresh_view(force=True)
        await pilot.pause()
        assert "listing runs…" in first and "0 runs" not in first, first
        assert "2 runs, 1 running" in str(status.render()), status.render()


async def test_tab_moves_between_the_tables_and_enter_opens_the_row_under_the_cursor() -> None:
    """Tab, a row, enter: that run opens (the footer says `Open` there, `Newest` on a
    profile); a second Tab goes back to the profiles, not out of the pane to the hosts list
    or the tabs, where the footer had only q and ?."""
    from textual.widgets._footer import FooterKey

    from console.widgets.footer import Footer

    root, clock = two_runs("tab-focus")
    app = local_app(local_config(root), clock)
    async with app.run_test(size=(120, 40)) as pilot:
        await show_runs(pilot, len(upto_step(recorded_events(), 60)))

        def keys() -> set[str]:
            return {str(k.description) for k in app.screen.query_one(Footer).query(FooterKey)
                    if k.display}

        profiles, runs = app.screen.query_one(ProfileTable), app.screen.query_one(RunTable)
        # the labels' short forms where the whole footer would not fit 120 columns
        assert app.focused is profiles and "Newest" in keys()
        await pilot.press("tab")
        assert app.focused is runs and "Open" in keys()
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RunDetailScreen))
        assert app.screen.feed.run_id == FINISHED   # the row under the cursor, not the newest
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen))
        assert app.focused is runs
        await pilot.press("tab")
        await pilot.pause()
        assert app.focused is profiles, app.focused
        assert {"Push", "Launch", "Stop", "Refresh", "Resume", "Table"} <= keys(), keys()
        await pilot.press("tab")
        assert app.focused is runs and {"Push", "Launch", "Open"} <= keys(), keys()
