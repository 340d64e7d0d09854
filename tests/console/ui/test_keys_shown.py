"""What the key map promises, on the running app: each pane's footer shows every action the pane
has (a key left out of a footer is a cursor key or repeats a label the footer shows), inside the
screen at 80 and at 120 columns; help lists each key once per section; `q` quits from any
screen or dialog, and in a text field is the letter q."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input
from textual.widgets._footer import FooterKey

from console.dialogs.confirm import ConfirmScreen
from console.dialogs.convert_dialog import ConvertDialog
from console.dialogs.help import HelpScreen, sections
from console.ui.keymap import KEYS, PANES
from tests.panes import app_for, checkpoints_tree, open_pane, report_shown
from tests.replay import fleet_app
from tests.waiting import wait_for


def footer_keys(pilot: Pilot[Any]) -> dict[str, FooterKey]:
    """The footer's shown keys by their key (the focused table's `enter` says what it opens)."""
    return {k.key: k for k in pilot.app.screen.query(FooterKey) if k.display}


def test_a_key_left_out_of_the_footers_is_no_action_of_its_own() -> None:
    """footer=False only for cursor keys and keys whose label a shown key says (no palette
    command of their own): anything a person may want to do is in a footer."""
    for k in KEYS:
        if k.bound and not k.footer and k.section != "main":
            assert not k.palette, (k.section, k.keys, k.label)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_every_pane_action_is_in_its_footer(tmp_path: Path, size: tuple[int, int]) -> None:
    app = fleet_app(tmp_path)
    async with app.run_test(size=size) as pilot:
        for n, (tab_id, title) in enumerate(PANES, start=1):
            await pilot.press(str(n))
            await pilot.pause()
            shown = footer_keys(pilot)
            screen = pilot.app.screen.region
            want = {k.keys.split(",")[0] for k in KEYS
                    if k.section == tab_id and k.bound and k.palette}
            missing = sorted(want - set(shown))
            assert not missing, (title, size, missing, sorted(shown))
            palette = shown.pop("ctrl+p").region
            assert "question_mark" in shown, (title, size)
            for key, widget in shown.items():   # whole, and clear of the palette key
                region = widget.region
                assert region.area and screen.contains_region(region), (title, key, region)
                assert not region.overlaps(palette), (title, key, region, palette)


def test_help_lists_each_key_once_per_section() -> None:
    for title, rows in sections():
        keys = [key for key_text, _d in rows for key in key_text.split()]
        assert len(keys) == len(set(keys)), (title, keys)


async def test_q_quits_from_help(tmp_path: Path) -> None:
    app = fleet_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running or app._exit, "q closed help instead of quitting"


async def test_q_is_a_letter_in_a_text_field_and_quits_from_a_dialog_elsewhere(
        tmp_path: Path, utc: None) -> None:
    shelf = checkpoints_tree(tmp_path)
    app = app_for(tmp_path, shelf)
    async with app.run_test(size=(120, 40)) as pilot:
        pane = await open_pane(pilot)
        await wait_for(pilot, lambda: report_shown(pane, str(shelf / "aq-medai-eagle3")))
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, ConvertDialog))
        field = app.screen.query(Input).first()
        field.focus()
        field.value = "/tmp/x"
        await pilot.press("end", "q")
        await pilot.pause()
        assert app.is_running and isinstance(app.screen, ConvertDialog)
        assert field.value == "/tmp/xq", field.value
        app.set_focus(None)
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running or app._exit, "q in a dialog did nothing"


async def test_q_quits_from_a_question(tmp_path: Path) -> None:
    app = fleet_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        app.push_screen(ConfirmScreen("Stop it?", yes="Stop it"))
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running or app._exit, "q did nothing in a question"
