"""Offline evaluation from the console: `e` on a checkpoint and the `eval`
subcommand run the real `python -m engine eval` on the host (the demo workspace's target, public
drafter and held-out data) and show its figures, the same as the engine prints when run by hand;
bad input is named in the dialog or in one line, with a non-zero exit."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Checkbox, Input, Static

from console.cli import main as cli_main
from console.demo.config import demo_profiles
from console.dialogs.eval_dialog import EvalDialog
from console.settings.config import Config, HostConfig
from console.widgets.inspect_view import InspectView
from tests.conftest import ssh_host
from tests.engine_helpers import run_engine
from tests.panes import open_pane, report_shown
from tests.runs_registry import local_app
from tests.sshd import SSHD
from tests.waiting import wait_for

pytest_plugins = ("tests.demo_workspace",)

K, SAMPLES = 2, 8


def engine_figures(demo: Path) -> dict[str, Any]:
    """What `python -m engine eval --json` says when run by hand on the demo."""
    p = run_engine("eval", "--draft", str(demo / "public-drafter"), "--target",
                   str(demo / "target"), "--data", str(demo / "eval"), "--steps", str(K),
                   "--max-samples", str(SAMPLES), "--json")
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def by_hand(demo_dir: Path) -> dict[str, Any]:
    return engine_figures(demo_dir)


def test_eval_subcommand_over_ssh_gives_the_engines_figures(
        demo_dir: Path, by_hand: dict[str, Any], sshd: SSHD, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    host = ssh_host(sshd, name="box", python=sys.executable, root=str(tmp_path / "root"))
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.box]\nssh = "{host.ssh}"\nknown_hosts = "{host.known_hosts}"\n'
                   f'identity = "{host.identity}"\npython = "{sys.executable}"\n'
                   f'root = "{tmp_path / "root"}"\n')
    argv = ["--config", str(cfg), "eval", "box", str(demo_dir / "public-drafter"),
            "--target", str(demo_dir / "target"), "--data", str(demo_dir / "eval"),
            "-k", str(K), "--samples", str(SAMPLES)]
    assert cli_main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["acceptance_length"] == pytest.approx(by_hand["acceptance_length"], abs=1e-9)
    assert got["per_position"] == pytest.approx(by_hand["per_position"], abs=1e-9)
    assert (got["drafts"], got["k"], got["path"]) == (by_hand["drafts"], K, "transformers")
    assert cli_main(argv) == 0
    line = capsys.readouterr().out.strip()
    assert f"acceptance length {by_hand['acceptance_length']:.2f} (k={K})" in line
    # bad input: the engine's reason in one line, exit 1
    assert cli_main([*argv[:-6], "--data", str(tmp_path / "nope"), "-k", "2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope" in err[0], err


async def test_e_on_a_checkpoint_evaluates_it(demo_dir: Path, by_hand: dict[str, Any],
                                              tmp_path: Path) -> None:
    drafter = str(demo_dir / "public-drafter")
    config = Config(hosts={"local": HostConfig(name="local", python=sys.executable,
                                               root=str(tmp_path / "host"),
                                               checkpoints=[drafter])},
                    profiles=demo_profiles(str(demo_dir)), demo=str(demo_dir))
    app = local_app(config)
    async with app.run_test(size=(120, 40)) as pilot:
        pane = await open_pane(pilot)
        await wait_for(pilot, lambda: report_shown(pane, drafter))
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, EvalDialog)
                       and bool(app.screen.query("#eval-data")))
        dialog = app.screen
        # proposed: the target the profiles train against and the demo's held-out samples (the
        # training data would read high: the drafter has seen it)
        assert dialog.query_one("#eval-target", Input).value == str(demo_dir / "target")
        assert dialog.query_one("#eval-data", Input).value == str(demo_dir / "eval")
        dialog.query_one("#eval-k", Input).value = "zero"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: "whole numbers" in str(
            dialog.query_one("#eval-error", Static).render()))
        assert app.screen is dialog   # still open, the reason under the fields
        dialog.query_one("#eval-k", Input).value = str(K)
        dialog.query_one("#eval-samples", Input).value = str(SAMPLES)
        assert dialog.query_one("#eval-vllm", Checkbox).value is False
        await pilot.press("ctrl+s")
        view = pane.query_one(InspectView)
        want = f"acceptance length {by_hand['acceptance_length']:.2f} (k={K})"
        await wait_for(pilot, lambda: want in view.message, timeout=240)
        assert "transformers" in view.message and str(demo_dir / "eval") in view.message
        # a second `e` proposes the data folder just used
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, EvalDialog))
        assert app.screen.query_one("#eval-data", Input).value == str(demo_dir / "eval")
        await pilot.press("escape")
