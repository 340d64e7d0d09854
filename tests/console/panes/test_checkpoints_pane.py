"""The checkpoints pane on the local host with real drafter checkpoints on disk (written with the
safetensors library): a snapshot of the list and an inspect report, a conversion driven by keys
through the dialog with the engine's progress and the result's report, engine errors shown in
full (an existing destination, a corrupt checkpoint), and the `inspect` / `convert` subcommands."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Checkbox, Input, Label, Select, Static

from console.cli import main as cli_main
from console.dialogs.convert_dialog import ConvertDialog, default_destination
from console.panes.checkpoints import CheckpointsPane, CheckpointTable
from console.screens.main import MainScreen
from console.settings.config import HostConfig
from console.widgets.inspect_view import InspectView
from console.widgets.meters import count
from tests.panes import (
    CHECKPOINTS_SIZE,
    MTIME,
    app_for,
    checkpoints_tree,
    open_pane,
    report_shown,
)
from tests.replay import FrozenClock
from tests.runs_registry import fresh_snap_root, local_app, local_config
from tests.waiting import wait_for

SIZE = CHECKPOINTS_SIZE
pytestmark = pytest.mark.usefixtures("utc")   # times on screen are local times


async def open_convert(pilot: Pilot[Any], pane: CheckpointsPane, path: str) -> None:
    """`c` on `path` once its inspect report is shown; returns when the convert dialog is up."""
    await wait_for(pilot, lambda: report_shown(pane, path))
    await pilot.press("c")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ConvertDialog))


def test_snapshot_checkpoints_pane(snap_compare: Any) -> None:
    root = fresh_snap_root("checkpoints-pane")
    shelf = checkpoints_tree(root)

    async def run_before(pilot: Pilot[Any]) -> None:
        pane = await open_pane(pilot)
        await pilot.press("down", "down")   # the run's out/final: its provenance shows
        target = str(root / "host" / "runs" / "finetune-20261130-140141-0f0f" / "out" / "final")
        await wait_for(pilot, lambda: report_shown(pane, target))
        await pilot.pause()

    assert snap_compare(app_for(root, shelf), terminal_size=SIZE, run_before=run_before)


def convert_dialog_back(app: Any, first: Any) -> bool:
    """A new convert dialog (not `first`) is on screen with every field mounted and its reason
    shown (the screen's type comes first, its widgets one by one after it)."""
    s = app.screen
    if not isinstance(s, ConvertDialog) or s is first:
        return False
    fields = [s.query(f"#{wid}") for wid in ("convert-dst", "convert-force", "convert-dtype",
                                             "convert-dst-error")]
    return all(f and f.first().is_mounted for f in fields) and \
        bool(str(s.query_one("#convert-dst-error", Static).render()).strip())


@pytest.mark.slow
async def test_list_inspect_and_convert_with_keys(tmp_path: Path) -> None:
    shelf = checkpoints_tree(tmp_path)
    app = app_for(tmp_path, shelf)
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_pane(pilot)
        table = pane.query_one(CheckpointTable)
        run_final = str(tmp_path / "host" / "runs" / "finetune-20261130-140141-0f0f" / "out" /
                        "final")
        assert table.paths == [str(shelf / "aq-medai-eagle3"),
                               str(shelf / "speculators-sharded"), run_final]
        assert table.rows_shown[2][0] == "runs/finetune-20261130-140141-0f0f/out/final"
        await wait_for(pilot, lambda: report_shown(pane, str(shelf / "aq-medai-eagle3")))
        view = pane.query_one(InspectView)
        assert view.report and view.report.ok and view.report.format == "eagle"
        assert "✔ all checks pass" in view.plain and "FAIL" not in view.plain
        # c: the dialog proposes ROOT/converted/<name>-<style>; choose sglang and bf16
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, ConvertDialog))
        dialog = app.screen
        dialog.query_one("#convert-to", Select).value = "sglang"
        dialog.query_one("#convert-dtype", Select).value = "bf16"
        await pilot.pause()
        dst = str(tmp_path / "host" / "converted" / "aq-medai-eagle3-sglang")
        assert dialog.query_one("#convert-dst", Input).value == dst
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: pane.converting is None and view.heading.startswith(
            "converted to sglang") and view.report is not None)
        assert view.report.ok and view.report.path == dst
        assert {t.dtype for t in view.report.tensors
                if t.name not in ("d2t", "t2d")} == {"BF16"}
        assert json.loads((Path(dst) / "provenance.json").read_text())["source"]
        await wait_for(pilot, lambda: dst in table.paths)
        assert table.selected == dst
        # the same again without "replace": refused before the engine runs, and the dialog
        # comes back as it was with the reason under the destination
        table.select(str(shelf / "aq-medai-eagle3"))
        await pilot.pause()
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, ConvertDialog))
        app.screen.query_one("#convert-to", Select).value = "sglang"
        app.screen.query_one("#convert-dtype", Select).value = "bf16"
        await pilot.pause()
        assert not app.screen.query_one("#convert-force", Checkbox).value
        first = app.screen
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: convert_dialog_back(app, first),
                       what="the convert dialog back with its reason")
        await pilot.pause()
        again = app.screen
        assert again.query_one("#convert-dst", Input).value == dst
        assert again.query_one("#convert-to", Select).value == "sglang"
        assert again.query_one("#convert-dtype", Select).value == "bf16"
        assert again.focused is again.query_one("#convert-dst", Input)
        error = again.query_one("#convert-dst-error", Static)
        assert error.display and "already exists" in str(error.render())
        # in the dialog's words (its checkbox), not the CLI's --force; nothing was run
        assert "“replace if it exists”" in str(error.render())
        assert "--force" not in str(error.render())
        assert pane.converting is None
        await pilot.pause(1.0)   # seconds later it is still there: nothing overwrote it
        assert app.screen is again
        # a new name converts
        again.query_one("#convert-dst", Input).value = dst + "-2"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: pane.converting is None and view.report is not None
                       and view.heading.startswith("converted to sglang"))
        assert view.report.path == dst + "-2"


async def test_replace_refused_by_the_engine_reopens_the_dialog(tmp_path: Path) -> None:
    """A "replace" over a folder holding notes.txt is
    refused by the engine; the dialog comes back filled in with its reason; notes.txt stays."""
    shelf = checkpoints_tree(tmp_path)
    notes = tmp_path / "host" / "converted" / "mine"
    notes.mkdir(parents=True)
    (notes / "notes.txt").write_text("my notes")
    app = app_for(tmp_path, shelf)
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_pane(pilot)
        view = pane.query_one(InspectView)
        await open_convert(pilot, pane, str(shelf / "aq-medai-eagle3"))
        first = app.screen
        first.query_one("#convert-dst", Input).value = str(notes)
        first.query_one("#convert-force", Checkbox).value = True
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: convert_dialog_back(app, first),
                       what="the convert dialog back with its reason")
        await pilot.pause()
        again = app.screen
        assert again.query_one("#convert-dst", Input).value == str(notes)
        assert again.query_one("#convert-force", Checkbox).value
        text = str(again.query_one("#convert-dst-error", Static).render())
        assert "notes.txt" in text and "not replaced" in text and "--force" not in text
        assert str(notes) not in text   # the field above shows the path
        await wait_for(pilot, lambda: report_shown(pane, str(shelf / "aq-medai-eagle3")))
        assert view.error is None
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen))
    assert os.listdir(notes) == ["notes.txt"] and (notes / "notes.txt").read_text() == "my notes"


async def test_convert_dialog_requires_and_prefills_the_verifier_for_speculators(
        tmp_path: Path) -> None:
    shelf = checkpoints_tree(tmp_path)
    app = app_for(tmp_path, shelf)
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_pane(pilot)
        await open_convert(pilot, pane, str(shelf / "aq-medai-eagle3"))
        dialog = app.screen
        label = dialog.query_one("#convert-verifier-label", Label)
        assert "optional" in str(label.render())
        # the demo profiles on this host train against /data/demo/target: proposed
        verifier = dialog.query_one("#convert-verifier", Input)
        assert verifier.value == "/data/demo/target"
        dialog.query_one("#convert-to", Select).value = "speculators"
        await pilot.pause()
        assert "required" in str(label.render()) and "*" in str(label.render())
        verifier.value = ""
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is dialog and pane.converting is None   # refused, still open
        assert dialog.focused is verifier
        verifier.value = "/data/demo/target"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: app.screen is not dialog)


async def test_the_inspect_view_shows_the_provenance(tmp_path: Path) -> None:
    """Step, held-out tau, finetune source and hashes, or that none is
    recorded, where a checkpoint is chosen."""
    shelf = checkpoints_tree(tmp_path)
    app = app_for(tmp_path, shelf)
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_pane(pilot)
        view = pane.query_one(InspectView)
        await wait_for(pilot, lambda: report_shown(pane, str(shelf / "aq-medai-eagle3")))
        assert "provenance  none recorded (not written by this engine)" in view.plain
        final = pane.query_one(CheckpointTable).paths[2]
        await pilot.press("down", "down")
        await wait_for(pilot, lambda: report_shown(pane, final))
        lines = [ln.strip() for ln in view.plain.splitlines()]
        assert "step        150 · held-out tau 3.441" in lines
        assert f"finetune    {shelf / 'aq-medai-eagle3'} (eagle, sha256 3f1c9a0b7d2e)" in lines
        assert "hashes      data sha256 552e8375cd4b · vocab sha256 ce005e6fa3fa" in lines
        assert view.report and view.report.step == 150


async def test_serve_proposes_the_verifier_the_convert_dialog_knows(tmp_path: Path) -> None:
    """The serve dialog was empty where the convert dialog proposed the
    profiles' target; a verifier given to a conversion is proposed to serve as well."""
    from console.dialogs.serve_dialog import ServeDialog

    shelf = checkpoints_tree(tmp_path)
    app = app_for(tmp_path, shelf)
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_pane(pilot)
        await open_convert(pilot, pane, str(shelf / "aq-medai-eagle3"))
        known = app.screen.query_one("#convert-verifier", Input).value
        assert known == "/data/demo/target"
        await pilot.press("escape")
        await pilot.press("v")
        await wait_for(pilot, lambda: isinstance(app.screen, ServeDialog))
        assert app.screen.query_one("#serve-verifier", Input).value == known
        await pilot.press("escape")
        await pilot.press("c")   # a conversion that records another verifier
        await wait_for(pilot, lambda: isinstance(app.screen, ConvertDialog))
        app.screen.query_one("#convert-verifier", Input).value = "/models/kimi"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: pane.converting is None and isinstance(app.screen,
                                                                             MainScreen)
                       and pane.query_one(InspectView).heading.startswith("converted"))
        pane.query_one(CheckpointTable).select(str(shelf / "aq-medai-eagle3"))
        await pilot.pause()
        await pilot.press("v")
        await wait_for(pilot, lambda: isinstance(app.screen, ServeDialog))
        assert app.screen.query_one("#serve-verifier", Input).value == "/models/kimi"


async def test_serve_with_an_empty_verifier_says_why_in_the_dialog(tmp_path: Path) -> None:
    """ctrl+s with the verifier emptied seemed to do nothing (a toast alone was missed):
    the dialog stays, says what is missing under the field and puts the cursor there; the
    same for a TP that is not a number. A good value clears it."""
    from console.dialogs.serve_dialog import ServeDialog

    shelf = checkpoints_tree(tmp_path)
    app = app_for(tmp_path, shelf)
    async with app.run_test(size=SIZE) as pilot:
        await open_pane(pilot)
        await pilot.press("v")
        await wait_for(pilot, lambda: isinstance(app.screen, ServeDialog))
        dialog = app.screen
        box = dialog.query_one("#serve-verifier", Input)
        box.value = ""
        dialog.query_one("#serve-k", Input).focus()
        await pilot.press("ctrl+s")
        await pilot.pause()
        error = dialog.query_one("#serve-error", Static)
        assert app.screen is dialog and error.display
        assert "Verifier: enter the target model" in str(error.render())
        assert app.focused is box
        box.value = "/models/kimi"
        dialog.query_one("#serve-tp", Input).value = ""
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is dialog and "TP: enter a whole number" in str(error.render())
        assert app.focused is dialog.query_one("#serve-tp", Input)
        await pilot.press("escape")


async def test_a_configured_folder_that_does_not_exist_is_named(tmp_path: Path) -> None:
    """`checkpoints = ["/data/ckpts"]` with no such folder said nothing."""
    shelf = checkpoints_tree(tmp_path)
    gone = tmp_path / "no-such-shelf"
    config = local_config(tmp_path / "host", checkpoints=[str(shelf), str(gone)])
    async with local_app(config, FrozenClock(MTIME + 60)).run_test(size=SIZE) as pilot:
        pane = await open_pane(pilot)
        status = str(pane.query_one("#ckpt-status", Static).render())
        assert f"configured folder {gone}: no such folder" in status
        assert len(pane.query_one(CheckpointTable).paths) == 3   # the others are still listed
    empty = tmp_path / "empty"
    config = local_config(empty / "host", checkpoints=[str(gone)])
    async with local_app(config, FrozenClock(MTIME + 60)).run_test(size=SIZE) as pilot:
        pane = await open_pane(pilot)
        view = pane.query_one(InspectView)
        await wait_for(pilot, lambda: view.report is None and "No checkpoints" in view.plain)
        assert f"the configured folder {gone}: no such folder on local" in view.plain


async def test_a_corrupt_checkpoint_shows_the_engine_error(tmp_path: Path) -> None:
    shelf = checkpoints_tree(tmp_path)
    bad = shelf / "aq-medai-eagle3" / "model.safetensors"
    bad.write_bytes(bad.read_bytes()[:300])            # truncated mid-header
    app = app_for(tmp_path, shelf)
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_pane(pilot)
        view = pane.query_one(InspectView)
        await wait_for(pilot, lambda: view.error is not None)
        assert view.error.startswith("inspect failed: local: ")
        assert "model.safetensors" in view.error
        assert "✖" in view.plain


def test_default_destination_names_the_run_step_and_one_style() -> None:
    """By run and step (`checkpoints-step_000150-vllm` was the same for every
    run), and a re-convert names one style (not `…-vllm-speculators-sglang`)."""
    c = "/r/converted"
    assert default_destination("/r/runs/ft-1/out/checkpoints/step_000150", "vllm", c) == \
        "/r/converted/ft-1-step_000150-vllm"
    assert default_destination("/r/runs/ft-2/out/checkpoints/step_000150", "vllm", c) == \
        "/r/converted/ft-2-step_000150-vllm"
    assert default_destination("/r/runs/ft-1/out/final", "vllm", c) == \
        "/r/converted/ft-1-final-vllm"
    assert default_destination("/r/runs/ft-1/out/best", "vllm", c, step=120) == \
        "/r/converted/ft-1-best-step_000120-vllm"
    assert default_destination("/data/x/checkpoints/step_000010", "eagle", c) == \
        "/r/converted/x-step_000010-eagle"   # `engine train --out /data/x`
    assert default_destination("/r/converted/ft-1-step_000150-vllm", "sglang", c) == \
        "/r/converted/ft-1-step_000150-sglang"
    assert default_destination("/r/converted/checkpoints-step_000150-vllm-speculators",
                               "sglang", c) == "/r/converted/checkpoints-step_000150-sglang"
    assert default_destination("/d/aq-medai/", "sglang", c) == "/r/converted/aq-medai-sglang"


async def test_the_convert_dialog_proposes_run_and_step(tmp_path: Path) -> None:
    """The prefilled destination of a run's out/final names the run and the step its
    provenance records; a conversion of that conversion names one style."""
    shelf = checkpoints_tree(tmp_path)
    app = app_for(tmp_path, shelf)
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_pane(pilot)
        final = pane.query_one(CheckpointTable).paths[2]
        await pilot.press("down", "down")
        await open_convert(pilot, pane, final)
        field = app.screen.query_one("#convert-dst", Input)
        converted = tmp_path / "host" / "converted"
        first = str(converted / "finetune-20261130-140141-0f0f-final-step_000150-vllm")
        assert field.value == first
        app.screen.query_one("#convert-to", Select).value = "speculators"
        await pilot.pause()
        assert field.value == first.removesuffix("vllm") + "speculators"
        app.screen.query_one("#convert-to", Select).value = "vllm"
        await pilot.pause()
        await pilot.press("ctrl+s")
        table = pane.query_one(CheckpointTable)
        await wait_for(pilot, lambda: pane.converting is None and table.selected == first)
        await wait_for(pilot, lambda: report_shown(pane, first) or
                       pane.query_one(InspectView).heading.startswith("converted"))
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, ConvertDialog))
        app.screen.query_one("#convert-to", Select).value = "sglang"
        await pilot.pause()
        assert app.screen.query_one("#convert-dst", Input).value == \
            first.removesuffix("vllm") + "sglang"


@pytest.mark.slow
def test_inspect_and_convert_subcommands(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    shelf = checkpoints_tree(tmp_path)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.box]\npython = "{os.sys.executable}"\nroot = "{tmp_path / "host"}"\n')
    src = shelf / "speculators-sharded"
    assert cli_main(["--config", str(cfg), "inspect", "box", str(src), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["format"] == "speculators" and report["ok"]
    dst = tmp_path / "out" / "eagle"
    assert cli_main(["--config", str(cfg), "convert", "box", str(src), str(dst),
                     "--to", "eagle"]) == 0
    out = capsys.readouterr().out
    assert f"wrote {dst} (eagle style from speculators" in out and "FAIL" not in out
    assert (dst / "model.safetensors").exists()
    # bad input: one line naming the problem, exit 1, nothing written
    assert cli_main(["--config", str(cfg), "convert", "box", str(tmp_path / "nope"),
                     str(tmp_path / "out2"), "--to", "vllm"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: box: ") and "nope" in err[0]
    assert not (tmp_path / "out2").exists()
    assert cli_main(["--config", str(cfg), "inspect", "box", str(tmp_path / "nope")]) == 1


async def test_long_paths_leave_size_and_modified_on_80x24(tmp_path: Path) -> None:
    """Long configured paths pushed SIZE and MODIFIED off an 80-column
    pane; the start of the path gives way (its end names the drafter)."""
    deep = tmp_path / ("a-rather-long-folder-name-" * 3) / "checkpoints"
    shelf = checkpoints_tree(deep)
    app = local_app(local_config(deep / "host", checkpoints=[str(shelf)]), FrozenClock(MTIME))
    async with app.run_test(size=(80, 24)) as pilot:
        pane = await open_pane(pilot)
        table = pane.query_one(CheckpointTable)
        await pilot.pause()
        assert table.virtual_size.width <= table.size.width
        first = table.rows_shown[0]
        assert first[0].startswith("…") and first[0].endswith("/shelf/aq-medai-eagle3")
        assert first[1:] == ("260K", "11-30 12:00")
        await pilot.resize_terminal(200, 50)
        await pilot.pause()
        wide = table.rows_shown[0][0]   # more of the path where there is room for it
        assert len(wide) > len(first[0]) and wide.endswith("/shelf/aq-medai-eagle3")
        assert table.virtual_size.width <= table.size.width


async def test_convert_dialog_fits_100x30(tmp_path: Path) -> None:
    app = local_app(local_config(tmp_path / "host"))
    async with app.run_test(size=(100, 30)) as pilot:
        app.push_screen(ConvertDialog("/x/runs/ft-1/out/final", "/x/converted"))
        await pilot.pause()
        box = app.screen.query_one("#convert-box").region
        for wid in ("#convert-to", "#convert-dst", "#convert-verifier", "#convert-dtype",
                    "#convert-force", "#convert-ok", "#convert-cancel"):
            r = app.screen.query_one(wid).region
            assert r.height > 0 and box.contains_region(r) and r.bottom <= 30, wid
        await pilot.press("escape")
        assert isinstance(app.screen, MainScreen)


async def test_an_unreachable_host_is_named_once(tmp_path: Path) -> None:
    """`bad: cannot reach …`, not `bad: bad: cannot reach …`; and `1 checkpoint`."""
    config = local_config(tmp_path / "host")
    config.hosts["bad"] = HostConfig(name="bad", ssh="nobody@127.0.0.1:1",
                                     known_hosts=str(tmp_path / "known_hosts"))
    app = local_app(config)
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_pane(pilot)   # local: nothing found yet
        pane.show_host("bad")
        await wait_for(pilot, lambda: pane.scan_error is not None)
        assert pane.scan_error.startswith("bad: cannot reach"), pane.scan_error
        assert "bad: bad:" not in str(pane.query_one("#ckpt-status", Static).render())
    assert count(1, "checkpoint") == "1 checkpoint" and count(0, "run") == "0 runs"
    assert count(1204, "line") == "1,204 lines"
