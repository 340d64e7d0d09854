"""Themes: the palettes, styles that use theme variables only, switching from the command palette
and `--theme`, and the choice remembered in the config file (the rest of the file kept)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from console.app import create_app
from console.errors import ConfigError
from console.settings.config import Config, HostConfig, default_config_path, load_config
from console.ui.themes import THEMES_DIR, css_paths, load_palettes, remember_theme
from tests.paths import REPO
from tests.replay import fleet_app

RAW_COLOUR = re.compile(r"#[0-9a-fA-F]{3,8}\b|\b(?:rgb|rgba|hsl|hsla)\(|\bansi_\w+")
CONFIG = '''# my hosts
[hosts.gpu1]
ssh = "gpu1"   # the big box
logs = ["/root/vllm.log"]

[profiles.ft]
host = "gpu1"
run = "engine train"
'''


def _config(tmp_path: Path, text: str = CONFIG) -> Config:
    path = tmp_path / "config.toml"
    path.write_text(text)
    cfg = load_config(path)
    # the TUI tests must not reach gpu1: keep only a local host that runs nothing
    cfg.hosts = {"local": HostConfig(name="local", python="/bin/false", root=str(tmp_path / "r"))}
    return cfg


def test_four_palettes_and_every_stylesheet_uses_theme_variables() -> None:
    themes = {t.name: t for t in load_palettes()}
    assert {"eagle3-dark", "eagle3-light", "eagle3-high-contrast"} <= set(themes)
    assert len(themes) >= 4
    assert themes["eagle3-dark"].dark and not themes["eagle3-light"].dark
    sheets = css_paths()
    assert sheets[0].name == "base.tcss" and {p.name for p in sheets} >= {"gpu.tcss", "logs.tcss"}
    for sheet in THEMES_DIR.glob("*.tcss"):
        body = re.sub(r"/\*.*?\*/", "", sheet.read_text(), flags=re.S)
        assert not RAW_COLOUR.findall(body), f"{sheet.name} has a raw colour"
        for m in re.finditer(r"\b(color|background|border[\w-]*|tint)\s*:\s*([^;]+);", body):
            if m.group(2).strip() not in ("none", "transparent"):
                assert "$" in m.group(2), f"{sheet.name}: {m.group(0)} is not a theme variable"


def test_no_raw_colours_in_console_python() -> None:
    for py in (REPO / "console").rglob("*.py"):
        assert not RAW_COLOUR.findall(py.read_text()), f"{py} has a raw colour"


def test_remember_theme_keeps_the_rest_of_the_file(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    remember_theme(cfg, "eagle3-light")
    text = (tmp_path / "config.toml").read_text()
    assert text == 'theme = "eagle3-light"\n' + CONFIG          # comments and order kept
    # a table's comments stay with it; a line without a newline at the end is completed
    other = tmp_path / "other.toml"
    other.write_text('# header\n\n# gpu box\n[hosts.a]\nssh = "a"')
    remember_theme(Config(hosts={}, path=other), "eagle3-dark")
    assert other.read_text() == (
        '# header\n\ntheme = "eagle3-dark"\n# gpu box\n[hosts.a]\nssh = "a"\n')
    other.unlink()
    remember_theme(cfg, "eagle3-solarized")                      # replaces, never duplicates
    text = (tmp_path / "config.toml").read_text()
    assert text.count("theme =") == 1 and load_config(tmp_path / "config.toml").theme == (
        "eagle3-solarized")
    assert [p.name for p in tmp_path.iterdir()] == ["config.toml"]  # no temp file left


def test_remember_theme_creates_the_default_config(tmp_path: Path) -> None:
    cfg = Config(hosts={"local": HostConfig(name="local")})
    path = remember_theme(cfg, "eagle3-high-contrast")
    assert path == default_config_path() and path.read_text() == 'theme = "eagle3-high-contrast"\n'
    assert load_config().theme == "eagle3-high-contrast" and cfg.path == path


async def test_theme_flag_applies_and_is_remembered(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    app = create_app(cfg, theme="eagle3-high-contrast")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert app.theme == "eagle3-high-contrast"
    assert load_config(tmp_path / "config.toml").theme == "eagle3-high-contrast"


async def test_switch_from_the_command_palette(tmp_path: Path) -> None:
    cfg = _config(tmp_path, 'theme = "eagle3-dark"\n' + CONFIG)
    app = create_app(cfg)
    async with app.run_test(size=(120, 40)) as pilot:
        assert app.theme == "eagle3-dark"
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"theme", "enter")    # the palette's "Theme" command
        await pilot.pause()
        await pilot.press(*"eagle3-light", "enter")
        await pilot.pause()
        assert app.theme == "eagle3-light"
    assert load_config(tmp_path / "config.toml").theme == "eagle3-light"


def test_unknown_theme_is_one_clear_line(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    with pytest.raises(ConfigError, match=r"--theme: unknown theme 'nope' \(ours: eagle3-dark"):
        create_app(cfg, theme="nope")
    (tmp_path / "bad.toml").write_text('theme = "purple"\n')
    out = subprocess.run([sys.executable, "-m", "console", "--config", str(tmp_path / "bad.toml")],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        f"error: {tmp_path / 'bad.toml'}: theme: unknown theme 'purple' (ours: eagle3-dark, "
        "eagle3-light, eagle3-high-contrast, eagle3-solarized; Textual's built-in themes work too)"]


def test_snapshot_gpu_pane_high_contrast(snap_compare: Any, tmp_path: Path) -> None:
    assert snap_compare(fleet_app(tmp_path, theme="eagle3-high-contrast"), terminal_size=(120, 40))


async def test_the_palettes_theme_command_lists_our_themes_only(tmp_path: Path) -> None:
    """ctrl+p, Theme: the four palettes of themes/palettes.toml, none of Textual's built-in
    ones (which still work by name from --theme or the config file)."""
    from textual.command import CommandList

    from tests.waiting import wait_for

    app = create_app(_config(tmp_path))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"theme", "enter")
        ours = [t.name for t in load_palettes()]

        def listed() -> list[str]:
            options = app.screen.query_one(CommandList).options
            return [str(o.prompt).split("\n")[0].strip() for o in options]

        await wait_for(pilot, lambda: len(listed()) >= len(ours), 20, "the theme list")
        await pilot.pause(0.3)
        assert sorted(listed()) == sorted(ours), listed()
