"""A host that sends markup, click actions, escape sequences and non-finite numbers
(tests/hostile.py writes them into a real runs registry, checkpoint folders, a log and a host
python): every pane, dialog, notification and subcommand shows them as text. Each of these
failed before host text was kept apart from markup: a MarkupError ended the app, a click ran an
action named in a folder's name, NaN and 1e400 crashed the plot, the table and `follow`, and the
subcommands wrote the escapes to the terminal raw."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from console.cli import main as cli_main
from console.dialogs.confirm import ConfirmScreen
from console.dialogs.convert_dialog import ConvertDialog
from console.dialogs.serve_dialog import ServeDialog
from console.panes.checkpoints import CheckpointsPane, CheckpointTable
from console.panes.logs import LogsPane
from console.panes.runs import RunsPane
from console.screens.main import MainScreen
from console.screens.run_detail import RunDetailScreen
from console.widgets.run_tables import RunTable
from tests.hostile import (
    BAD_MARKUP_RUN,
    CLICK_CKPT,
    CLOSE,
    ESCAPES,
    QUIT_RUN,
    Hostile,
    screenshots,
    write_hostile,
)
from tests.replay import FrozenClock
from tests.runs_registry import local_app
from tests.waiting import wait_for

SIZE = (120, 40)
T0 = 1_764_504_000.0


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Hostile:
    return write_hostile(tmp_path_factory.mktemp("hostile"), T0)


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Work in tmp_path: a screenshot action that ran would write its file here."""
    monkeypatch.chdir(tmp_path)
    yield
    assert screenshots(tmp_path) == []


def main_screen(pilot: Pilot[Any]) -> MainScreen:
    return next(s for s in pilot.app.screen_stack if isinstance(s, MainScreen))


def plain(widget: Any) -> str:
    """What a widget shows, as text (a Static's content, a table's cells)."""
    if isinstance(widget, DataTable):
        return "\n".join(" ".join(str(getattr(c, "plain", c)) for c in widget.get_row_at(i))
                         for i in range(widget.row_count))
    if isinstance(widget, Static):
        return str(getattr(widget.visual, "plain", widget.visual))
    return str(widget.render().plain)


def no_escapes(text: str) -> bool:
    return "\x1b" not in text and "\x07" not in text


def app_for(h: Hostile) -> Any:
    return local_app(h.config, FrozenClock(T0 + 10))


async def test_runs_pane_shows_hostile_runs_as_text(hostile: Hostile) -> None:
    """`[/b]` as a run's code, `[@click=app.quit]boom` as a run id (clicked), `[a=b=c]boom`
    stopped with x (the question shown), the NaN / 1e400 run opened: the app runs on and
    shows every one of them literally."""
    app = app_for(hostile)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        pane = main_screen(pilot).query_one(RunsPane)
        await wait_for(pilot, lambda: pane.model.listed > 0)
        table = pane.query_one(RunTable)
        await wait_for(pilot, lambda: len(table.ids) == 3)   # and the torn record
        pane.refresh_view(force=True)
        await pilot.pause()
        shown = plain(table)
        assert QUIT_RUN in shown and BAD_MARKUP_RUN in shown and CLOSE in shown
        assert no_escapes(shown), shown
        for row in (1, 2, 3):   # a click on a run's id (a second one opens it)
            await pilot.click(RunTable, offset=(3, row))
            await pilot.pause()
            assert app.is_running
            if isinstance(app.screen, RunDetailScreen):
                await pilot.press("escape")
        # x on the running one: the question names it as it is
        table.select(BAD_MARKUP_RUN)
        table.focus()
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        question = plain(app.screen.query_one("#confirm-question", Static))
        assert f"Stop {BAD_MARKUP_RUN}?" in question
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen)
                       and pane.model.busy is None)
        # x on the ended one: the activity line and the toast name it
        table.select(QUIT_RUN)
        await pilot.press("x")
        await pilot.pause()
        assert f"{QUIT_RUN} has already ended" in plain(pane.query_one("#runs-activity"))
        await pilot.click("#runs-activity", offset=(2, 0))
        assert app.is_running
        # enter: the run with NaN, 1e400 and -Infinity in its events opens and draws
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RunDetailScreen))
        screen = app.screen
        await wait_for(pilot, lambda: screen.feed.progress.events > 0)
        await pilot.pause(0.3)
        screen.refresh_view(force=True)
        await pilot.pause()
        title = plain(screen.query_one("#detail-title", Static))
        assert QUIT_RUN in title and no_escapes(title), title
        await pilot.click("#detail-title", offset=(1, 0))
        assert app.is_running
        await pilot.press("escape")
        assert app.is_running


async def test_checkpoint_folders_are_text_in_the_pane_and_dialogs(hostile: Hostile) -> None:
    """A folder whose path ends in `[/b]` is listed; one named
    `[@click=app.screenshot(...)]ck` shows its name in the serve and convert dialogs, and a
    click on the title writes no file."""
    app = app_for(hostile)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("6")
        pane = main_screen(pilot).query_one(CheckpointsPane)
        await wait_for(pilot, lambda: pane.scans > 0)
        table = pane.query_one(CheckpointTable)
        await wait_for(pilot, lambda: len(table.paths) == 2)
        shown = plain(table)
        assert CLICK_CKPT in shown and CLOSE in shown, shown
        click = next(p for p in table.paths if p.endswith(CLICK_CKPT))
        table.select(click)
        table.focus()
        await pilot.pause()
        dialogs = (("v", ServeDialog, "#serve-title", f"Serve {click} in vLLM"),
                   ("c", ConvertDialog, "#convert-title", f"Convert {click}"))
        for key, dialog, title, said in dialogs:
            await pilot.press(key)
            await wait_for(pilot, lambda d=dialog: isinstance(app.screen, d))
            widget = app.screen.query_one(title, Static)
            shown = plain(widget)
            assert said in shown, shown
            for x in range(0, widget.size.width, 5):   # clicks along the whole title
                await pilot.click(title, offset=(x, 0))
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, MainScreen))
        assert app.is_running


async def test_host_pane_shows_a_failing_python_s_stderr_as_text(hostile: Hostile) -> None:
    """The Host pane (doctor) of a host whose python prints `[/usr/lib]` and escapes on stderr
    and fails: the error is shown, literally, and the app runs on."""
    app = app_for(hostile)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await pilot.press("]")   # the `evil` host
        report = main_screen(pilot).query_one("#doctor-report", Static)
        await wait_for(pilot, lambda: "[/usr/lib]" in plain(report))
        assert no_escapes(plain(report))
        await pilot.pause(0.2)
        assert app.is_running


async def test_logs_pane_and_notifications_show_host_text(hostile: Hostile) -> None:
    """The Logs pane follows a log of markup and escapes; a toast quoting a host's text shows
    it as written (notify parsed markup: `[/b]` ended the app)."""
    app = app_for(hostile)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        pane = main_screen(pilot).query_one(LogsPane)
        await wait_for(pilot, lambda: pane.model.total >= 3)
        await pilot.pause(0.2)
        pane.notify(f"{CLOSE} {QUIT_RUN} {ESCAPES}")
        app.notify(BAD_MARKUP_RUN, title=CLOSE)
        await pilot.pause(0.3)
        # a Toast renders a notification's message as markup unless it says otherwise
        shown = list(app._notifications)
        assert shown and not any(n.markup for n in shown), shown
        texts = [n.title + n.message for n in shown]
        assert any(f"{CLOSE} {QUIT_RUN}" in t for t in texts), texts
        assert any(f"{CLOSE}{BAD_MARKUP_RUN}" in t for t in texts), texts
        assert all(no_escapes(t) for t in texts), texts
        assert app.is_running


# -- subcommands ---------------------------------------------------------------------------------

def cli(hostile: Hostile, tmp_path: Path, *argv: str) -> list[str]:
    conf = tmp_path / "config.toml"
    conf.write_text(f'[hosts.local]\npython = {json.dumps(__import__("sys").executable)}\n'
                    f'root = {json.dumps(str(hostile.root))}\n'
                    f'checkpoints = [{json.dumps(str(hostile.shelf))}]\n')
    return ["--config", str(conf), *argv]


@pytest.mark.parametrize("argv", [
    ("runs", "local"), ("logs", "local", "LOG"), ("logs", "local", "LOG", "-n", "50"),
    ("follow", QUIT_RUN), ("stop", QUIT_RUN), ("stop", "nosuch" + ESCAPES)])
def test_subcommands_print_escapes_as_text(hostile: Hostile, tmp_path: Path, argv: tuple[str, ...],
                                          capfd: pytest.CaptureFixture[str]) -> None:
    """OSC 52 (clipboard), OSC 0 (title), ESC[2J and the other control characters a host sent
    are printed as ^X / \\xNN, never raw; --json keeps the exact text (JSON escapes it)."""
    args = [str(hostile.log) if a == "LOG" else a for a in argv]
    code = cli_main(cli(hostile, tmp_path, *args))
    out, err = capfd.readouterr()
    assert code in (0, 1), (code, out, err)
    assert "Traceback" not in err, err
    for stream in (out, err):
        assert "\x1b" not in stream and "\x07" not in stream and "\x9b" not in stream, stream
    if argv[0] in ("logs", "follow"):
        assert "^[]52;c;" in out, out
    if argv[0] == "stop" and "nosuch" in argv[1]:
        assert code == 1 and "error: no run 'nosuch" in err, err


def test_json_keeps_the_exact_text(hostile: Hostile, tmp_path: Path,
                                   capfd: pytest.CaptureFixture[str]) -> None:
    assert cli_main(cli(hostile, tmp_path, "logs", "local", str(hostile.log), "--json")) == 0
    out, _ = capfd.readouterr()
    texts = [json.loads(ln)["text"] for ln in out.splitlines()]
    assert any(ESCAPES in t for t in texts), texts
