"""The console on an 80x24 terminal, and on a 200x50 one: an SVG snapshot of every pane (GPUs,
Host, Fleet, Logs, Runs, Checkpoints), of help and of every dialog (convert, serve, compare,
confirm) at 80x24, and of the main screen at 200x50, each on the data its own pane's tests use.

Beside each snapshot, what a reader would look for first is checked by Pilot: the hosts list is
folded into the header, and every widget on the screen that a person types into or presses
(inputs, selects, buttons, checkboxes) lies inside the terminal and inside its dialog."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.cells import cell_len
from textual.geometry import Region
from textual.pilot import Pilot
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Button, Checkbox, Input, Label, Select

from console.app import Eagle3App
from console.dialogs.compare import CompareScreen
from console.dialogs.confirm import ConfirmScreen
from console.dialogs.convert_dialog import ConvertDialog
from console.dialogs.eval_dialog import EvalDialog
from console.dialogs.serve_dialog import ServeDialog
from console.hosts.host import HostPool
from console.monitor.service import MonitorHub
from console.panes.checkpoints import CheckpointTable
from console.screens.main import MainScreen
from console.settings.config import Config, HostConfig
from console.widgets.host_list import HostList
from console.widgets.line_plot import LinePlot, fmt_value
from console.widgets.log_charts import CHART_ROWS, LogCharts
from console.widgets.run_tables import RunTable
from tests.panes import (
    N_LINES,
    RUNNING,
    app_for,
    checkpoints_tree,
    logs_app,
    open_finished,
    open_logs,
    open_pane,
    report_shown,
    show_runs,
    two_runs,
)
from tests.replay import FrozenClock, fleet_app
from tests.runs_registry import fresh_snap_root, local_app, local_config, recorded_events, upto_step
from tests.serving_journal import two_served_drafters
from tests.waiting import wait_for as wait_until

SMALL = (80, 24)
LARGE = (200, 50)
CONTROLS = (Button, Input, Select, Checkbox)

# A GPU host's doctor report (recorded from `python -m engine doctor --events` and given eight
# H200s): the Host pane draws it exactly, on any machine
DOCTOR = {"engine": "0.1.0", "python": "3.11.7", "executable": "/root/venv/bin/python",
          "platform": "Linux-5.15.0-126-generic-x86_64-with-glibc2.35", "hostname": "gpu1",
          "cpus": 224,
          "packages": {"torch": "2.13.0+cu128", "safetensors": "0.8.0", "transformers": "5.25.0",
                       "tokenizers": "0.23.3", "nvidia-ml-py": "13.615.71", "psutil": "7.2.2"},
          "torch": {"available": True, "version": "2.13.0+cu128", "cuda": "12.8",
                    "cuda_available": True},
          "gpus": [{"index": i, "name": "NVIDIA H200", "memory_total": 150754820096}
                   for i in range(8)],
          "nvml": "NVML, driver 550.54.15",
          "disk": {"path": "/root/eagle3", "free": 2312894464000, "total": 7586405580800}}


def fits(pilot: Pilot[Any]) -> None:
    """Nothing a person uses is cut off: every control on the screen on top lies inside the
    terminal and inside the dialog box that holds it; the hosts list is folded on a small one;
    what a person reads is whole (shown_whole)."""
    screen = pilot.app.screen
    whole = screen.region
    shown_whole(screen)
    for w in screen.query("*"):
        if not isinstance(w, CONTROLS) or not w.display or not w.region.area:
            continue
        assert whole.contains_region(w.region), (type(w).__name__, w.id, w.region, whole)
        box = next((a for a in w.ancestors if isinstance(a, Widget) and a.has_class("dialog")),
                   None)
        if box is not None:   # inside its border and padding: where the box shows content
            assert box.content_region.contains_region(w.region), (w.id, w.region,
                                                                  box.content_region)
    for label in screen.query(Label):   # a field's label is read whole: not cut at the border
        if not label.display or not label.region.area:
            continue
        text = str(label.render())
        assert cell_len(text) <= label.region.width * label.region.height, (text, label.region)
        box = next((a for a in label.ancestors
                    if isinstance(a, Widget) and a.has_class("dialog")), None)
        assert (box.content_region if box else whole).contains_region(label.region), (
            text, label.region, box.content_region if box else whole)
    main = next(s for s in pilot.app.screen_stack if isinstance(s, MainScreen))
    narrow = whole.width < 100
    assert main.query_one(HostList).display is not narrow
    if narrow:
        assert main.sub_title.split()[0] == main.selected   # the header names the host


def first_line(w: Widget) -> str:
    """What the screen shows on a widget's first row."""
    return w.render_lines(Region(0, 0, w.size.width, 1))[0].text


def shown_text(w: Widget) -> str:
    """Every row a widget draws (past its window too), as text."""
    return "\n".join(s.text for s in w.render_lines(Region(0, 0, w.size.width,
                                                            max(1, w.virtual_size.height))))


def shown_whole(screen: Any) -> None:
    """On the widgets on screen: the checkpoints table's columns inside it (MODIFIED was cut
    when a scrollbar came), each plot's title row holding every series' latest value (run
    detail cut `held-out 3.930`), and the Host pane's values wrapping under their own column
    (a long path went on at the pane's edge)."""
    for table in screen.query(CheckpointTable):
        if table.display and table.region.area:
            assert table.virtual_size.width <= table.scrollable_content_region.width, (
                table.virtual_size, table.scrollable_content_region)
    for plot in screen.query(LinePlot):
        if not (plot.display and plot.region.area):
            continue
        line = first_line(plot)
        for _name, pts in plot.series:
            if pts:
                assert fmt_value(pts[-1][1]) in line, (plot.id, line)
    for report in screen.query("#doctor-report"):
        if not (report.display and report.region.area):
            continue
        lines = [s.text.rstrip() for s in report.render_lines(
            Region(0, 0, report.size.width, report.virtual_size.height))]
        lines = [ln for ln in lines if ln.strip()]
        rows = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("python ")), None)
        if rows is None:
            continue
        indent = len(lines[rows]) - len(lines[rows].lstrip())
        value_col = indent + len(lines[rows].lstrip().split("  ")[0].rstrip())
        value_col = len(lines[rows]) - len(lines[rows][value_col:].lstrip())
        for ln in lines[rows:]:
            lead = len(ln) - len(ln.lstrip())
            if lead > indent:   # a continuation or a GPU row: under the values
                assert lead >= value_col, (ln, value_col)
            else:               # a row: its label, then its value at the value column
                assert len(ln) - len(ln[indent:].split("  ", 1)[-1].lstrip()) == value_col, (
                    ln, value_col)


# -- panes ------------------------------------------------------------------------------------
def test_snapshot_gpus_80x24(snap_compare: Any, tmp_path: Path) -> None:
    """Eight GPUs with their bars, figures and history, the host line and the processes."""

    async def ready(pilot: Pilot[Any]) -> None:
        await pilot.pause()
        fits(pilot)

    assert snap_compare(fleet_app(tmp_path), terminal_size=SMALL, run_before=ready)


def test_snapshot_gpu_detail_80x24(snap_compare: Any, tmp_path: Path) -> None:
    """`d`: the detail view and all eight GPUs fit 24 lines."""

    async def ready(pilot: Pilot[Any]) -> None:
        await pilot.press("d")
        await pilot.pause()
        detail = pilot.app.screen.query_one("#gpu-detail")
        assert detail.display and pilot.app.screen.region.contains_region(detail.region)
        fits(pilot)

    assert snap_compare(fleet_app(tmp_path), terminal_size=SMALL, run_before=ready)


def doctor_app(tmp_path: Path, report: dict[str, Any] = DOCTOR) -> Eagle3App:
    """gpu1 runs on this machine with a `python` that answers `-m engine doctor` with `report`
    (and is the real interpreter for anything else the console runs there)."""
    event = {"v": 1, "kind": "result", "t": 0, "cmd": "doctor", "data": report}
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n"
                      f"case \" $* \" in *' -m engine doctor '*) echo '{json.dumps(event)}';"
                      " exit 0;; esac\n"
                      f"exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    config = Config(hosts={"gpu1": HostConfig(name="gpu1", python=str(python),
                                              root=str(tmp_path / "root"))})
    hub = MonitorHub(HostPool(config), clock=FrozenClock(), autostart=False)
    from console.app import create_app
    return create_app(config, clock=FrozenClock(), monitors=hub)


def test_snapshot_host_80x24(snap_compare: Any, tmp_path: Path) -> None:
    """The doctor report: one label column, eight GPUs, the disk line unwrapped."""

    async def ready(pilot: Pilot[Any]) -> None:
        await pilot.press("2")
        report = pilot.app.screen.query_one("#doctor-report")
        await wait_until(pilot, lambda: "eagle3 engine" in shown_text(report))
        await pilot.pause()
        fits(pilot)

    assert snap_compare(doctor_app(tmp_path), terminal_size=SMALL, run_before=ready)


async def test_long_host_values_wrap_under_their_column_at_80x24(tmp_path: Path) -> None:
    """A venv's long interpreter path and a deep disk path: their ends wrap under the values,
    not back at the pane's edge (where they read as labels)."""
    deep = "/home/someone/work/projects/eagle3/experiments/2026-11/venvs/train-env"
    report = DOCTOR | {"executable": f"{deep}/bin/python3.11",
                       "disk": DOCTOR["disk"] | {"path": f"{deep}/scratch/eagle3-root"}}
    async with doctor_app(tmp_path, report).run_test(size=SMALL) as pilot:
        await pilot.press("2")
        text = pilot.app.screen.query_one("#doctor-report")
        await wait_until(pilot, lambda: "eagle3 engine" in shown_text(text))
        await pilot.pause()
        fits(pilot)
        assert "bin/python3.11" in shown_text(text)   # wrapped, all of it there


def test_snapshot_fleet_80x24(snap_compare: Any, tmp_path: Path) -> None:
    """Every host's GPUs one line each: figures kept, process names shortened."""

    async def ready(pilot: Pilot[Any]) -> None:
        await pilot.press("3")
        await pilot.pause()
        fits(pilot)

    assert snap_compare(fleet_app(tmp_path), terminal_size=SMALL, run_before=ready)


def test_snapshot_logs_80x24(snap_compare: Any, tmp_path: Path) -> None:
    """The recorded vLLM log, followed: charts, then the newest lines."""
    app, _log = logs_app(tmp_path)

    async def ready(pilot: Pilot[Any]) -> None:
        await open_logs(pilot, N_LINES)
        fits(pilot)

    assert snap_compare(app, terminal_size=SMALL, run_before=ready)


async def test_log_chart_titles_keep_their_figures_at_80_columns(tmp_path: Path) -> None:
    """Each chart's title line holds its whole current figure at 80 columns (a shorter wording
    where the long one does not fit; never `mean acceptance length 2` for 2.13)."""
    app, _log = logs_app(tmp_path)
    async with app.run_test(size=SMALL) as pilot:
        pane = await open_logs(pilot, N_LINES)
        charts = pane.query_one(LogCharts)
        e, sp = pane.model.engine[-1], pane.model.spec[-1]
        text = [line.plain for line in charts.lines()]
        heads = text[0] + " " + text[CHART_ROWS + 1]
        want = [f"{e.generation_throughput:,.1f}", f"{e.prompt_throughput:,.1f}",
                f"{e.running} run", f"{e.waiting} wait", f"{e.kv_cache_usage_pct:.1f}%",
                f"{sp.mean_acceptance_length:.2f}",
                " ".join(f"{p:.2f}" for p in sp.per_position[:3])]
        missing = [w for w in want if w not in heads]
        assert missing == [], (missing, heads)


def test_snapshot_runs_80x24(snap_compare: Any, utc: None) -> None:
    """A running and a finished finetune: status and progress before names."""
    root, clock = two_runs("small-runs-pane")
    n = len(upto_step(recorded_events(), 60))

    async def ready(pilot: Pilot[Any]) -> None:
        await show_runs(pilot, n)
        fits(pilot)

    assert snap_compare(local_app(local_config(root), clock), terminal_size=SMALL,
                        run_before=ready)


def test_snapshot_checkpoints_80x24(snap_compare: Any, utc: None) -> None:
    root = fresh_snap_root("small-checkpoints-pane")
    shelf = checkpoints_tree(root)

    async def ready(pilot: Pilot[Any]) -> None:
        pane = await open_pane(pilot)
        await wait_until(pilot, lambda: report_shown(pane, str(shelf / "aq-medai-eagle3")))
        await pilot.pause()
        fits(pilot)

    assert snap_compare(app_for(root, shelf), terminal_size=SMALL, run_before=ready)


async def test_many_checkpoints_keep_their_modified_column_at_80x24(tmp_path: Path,
                                                                  utc: None) -> None:
    """More checkpoints than the table shows: its scrollbar comes, and MODIFIED stays whole
    (the paths give up the columns)."""
    from tests.drafters import write_drafter

    shelf = checkpoints_tree(tmp_path)
    for i in range(12):
        write_drafter(shelf / f"more-drafters-of-a-long-sweep-{i:02d}", seed=10 + i)
    app = app_for(tmp_path, shelf)
    async with app.run_test(size=SMALL) as pilot:
        pane = await open_pane(pilot)
        await wait_until(pilot, lambda: len(pane.query_one(CheckpointTable).paths) == 15)
        await pilot.pause()
        pane._draw()
        await pilot.pause()
        table = pane.query_one(CheckpointTable)
        assert table.show_vertical_scrollbar
        fits(pilot)


def test_snapshot_run_detail_80x24(snap_compare: Any, utc: None) -> None:
    """The finished finetune's detail: the progress line, the plots with each series' latest
    value in their title row (held-out 3.930), the log tail and provenance."""
    root, clock = two_runs("small-run-detail")

    async def ready(pilot: Pilot[Any]) -> None:
        await open_finished(pilot)
        await pilot.pause()
        fits(pilot)

    assert snap_compare(local_app(local_config(root), clock), terminal_size=SMALL,
                        run_before=ready)


def test_snapshot_help_80x24(snap_compare: Any, tmp_path: Path) -> None:
    """`?`: section titles alone at the left edge, descriptions wrapped beside their keys."""

    async def ready(pilot: Pilot[Any]) -> None:
        await pilot.press("question_mark")
        await pilot.pause()
        fits(pilot)

    assert snap_compare(fleet_app(tmp_path), terminal_size=SMALL, run_before=ready)


# -- dialogs ----------------------------------------------------------------------------------
async def open_dialog(pilot: Pilot[Any], shelf: Path, key: str, dialog: type) -> None:
    """The Checkpoints pane on the first drafter, then `key` (c: convert, v: serve)."""
    pane = await open_pane(pilot)
    await wait_until(pilot, lambda: report_shown(pane, str(shelf / "aq-medai-eagle3")))
    await pilot.press(key)
    await wait_until(pilot, lambda: isinstance(pilot.app.screen, dialog))
    await pilot.pause()


def test_snapshot_convert_dialog_80x24(snap_compare: Any, utc: None) -> None:
    root = fresh_snap_root("small-convert-dialog")
    shelf = checkpoints_tree(root)

    async def ready(pilot: Pilot[Any]) -> None:
        await open_dialog(pilot, shelf, "c", ConvertDialog)

    assert snap_compare(app_for(root, shelf), terminal_size=SMALL, run_before=ready)


def test_snapshot_serve_dialog_80x24(snap_compare: Any, utc: None) -> None:
    root = fresh_snap_root("small-serve-dialog")
    shelf = checkpoints_tree(root)

    async def ready(pilot: Pilot[Any]) -> None:
        await open_dialog(pilot, shelf, "v", ServeDialog)

    assert snap_compare(app_for(root, shelf), terminal_size=SMALL, run_before=ready)


@pytest.mark.parametrize("size", [SMALL, LARGE])
@pytest.mark.parametrize(("key", "dialog"), [("c", ConvertDialog), ("v", ServeDialog),
                                             ("e", EvalDialog)])
async def test_checkpoint_dialogs_fit_80x24(tmp_path: Path, utc: None, key: str,
                                            dialog: type, size: tuple[int, int]) -> None:
    shelf = checkpoints_tree(tmp_path)
    app = app_for(tmp_path, shelf)
    async with app.run_test(size=size) as pilot:
        await open_dialog(pilot, shelf, key, dialog)
        fits(pilot)


def test_snapshot_compare_80x24(snap_compare: Any) -> None:
    """Two served drafters (the compare tests' sessions) and the modal's own keys below."""
    root = fresh_snap_root("small-compare")
    url, t0 = "http://127.0.0.1:8000/metrics", 1_764_504_000.0
    two_served_drafters(url, t0)

    async def ready(pilot: Pilot[Any]) -> None:
        await pilot.press("6")
        pilot.app.push_screen(CompareScreen(measure=False))
        await pilot.pause()
        fits(pilot)

    assert snap_compare(local_app(local_config(root / "host")), terminal_size=SMALL,
                        run_before=ready)


def test_snapshot_confirm_80x24(snap_compare: Any, utc: None) -> None:
    """`x` on the running finetune: the question and both buttons inside the dialog."""
    root, clock = two_runs("small-confirm")
    n = len(upto_step(recorded_events(), 60))

    async def ready(pilot: Pilot[Any]) -> None:
        await show_runs(pilot, n)
        table = pilot.app.screen.query_one(RunTable)
        table.focus()
        table.select(RUNNING)
        await pilot.pause()
        await pilot.press("x")
        await wait_until(pilot, lambda: isinstance(pilot.app.screen, ConfirmScreen))
        await pilot.pause()
        assert RUNNING in str(pilot.app.screen.query_one("#confirm-question").render())
        fits(pilot)

    assert snap_compare(local_app(local_config(root), clock), terminal_size=SMALL,
                        run_before=ready)


# -- a large terminal -------------------------------------------------------------------------
def test_snapshot_main_screen_200x50(snap_compare: Any, tmp_path: Path) -> None:
    """The hosts list back at 200 columns; the GPU table's history takes the width."""

    async def ready(pilot: Pilot[Any]) -> None:
        await pilot.pause()
        fits(pilot)
        assert not isinstance(pilot.app.screen, ModalScreen)

    assert snap_compare(fleet_app(tmp_path), terminal_size=LARGE, run_before=ready)
