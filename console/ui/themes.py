"""Colour themes: palettes from themes/palettes.toml, styles from themes/*.tcss, and the chosen
theme remembered in the config file.

The .tcss files use theme variables only, so any registered theme restyles the whole console.
The command palette's "Theme" command offers ours only (OurThemes); Textual's built-in themes
still work when named by `--theme` or the config file.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import tomli_w
from textual.app import App
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.theme import Theme

from console.errors import ConfigError
from console.settings.config import Config, default_config_path, tomllib
from console.settings.safe_write import write_atomic

THEMES_DIR = Path(__file__).resolve().parents[2] / "themes"
PALETTES = THEMES_DIR / "palettes.toml"
DEFAULT_THEME = "eagle3-dark"
_FIELDS = {"primary", "secondary", "accent", "success", "warning", "error", "foreground",
           "background", "surface", "panel", "boost", "dark", "luminosity_spread", "text_alpha",
           "variables"}


def css_paths() -> list[Path]:
    """Every stylesheet in themes/: base.tcss first, the panes' own files after it."""
    rest = sorted(p for p in THEMES_DIR.glob("*.tcss") if p.name != "base.tcss")
    return [THEMES_DIR / "base.tcss", *rest]


def load_palettes(path: Path = PALETTES) -> list[Theme]:
    """The themes defined in palettes.toml (a wrong key names the file and theme)."""
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    themes = []
    for name, fields in raw.items():
        unknown = set(fields) - _FIELDS
        if unknown:
            raise ConfigError(f"{path}: [{name}] unknown keys {', '.join(sorted(unknown))}")
        themes.append(Theme(name=name, **fields))
    return themes


def register_themes(app: App[Any]) -> list[str]:
    """Register our palettes with the app; returns their names."""
    names = []
    for theme in load_palettes():
        app.register_theme(theme)
        names.append(theme.name)
    return names


class OurThemes(Provider):
    """The palette's theme list: the themes of palettes.toml, in its order."""

    def _themes(self) -> list[str]:
        return [t.name for t in load_palettes() if t.name in self.app.available_themes]

    def _set(self, name: str) -> None:
        self.app.theme = name

    async def discover(self) -> Hits:
        for name in self._themes():
            yield DiscoveryHit(name, partial(self._set, name))

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name in self._themes():
            if (score := matcher.match(name)) > 0:
                yield Hit(score, matcher.highlight(name), partial(self._set, name))


def check_theme(app: App[Any], name: str, where: str) -> str:
    """name if the app knows it, else ConfigError naming where it came from."""
    if name not in app.available_themes:
        ours = [t.name for t in load_palettes()]
        raise ConfigError(f"{where}: unknown theme {name!r} (ours: {', '.join(ours)}; Textual's "
                          "built-in themes work too)")
    return name


def remember_theme(config: Config, name: str) -> Path:
    """Set `theme = "name"` in the config file, keeping every other line (comments included).

    The file is written to a temp name beside it (beside a symlink's target) and renamed, so a
    crash never leaves a half file and a symlinked config stays a symlink; with no config file
    yet, one is created at the default path holding only the theme."""
    path = config.path or default_config_path()
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    line = tomli_w.dumps({"theme": name}).strip()
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    first_table = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("[")),
                       len(lines))
    existing = [i for i, ln in enumerate(lines[:first_table])
                if "=" in ln and ln.split("=", 1)[0].strip() == "theme"]
    if existing:
        lines[existing[0]] = line + "\n"
    else:
        at = first_table  # top-level keys go before the first table and the comments above it
        while at > 0 and lines[at - 1].lstrip().startswith("#"):
            at -= 1
        lines.insert(at, line + "\n")
    out = lines
    new = "".join(out)
    if tomllib.loads(new).get("theme") != name:  # never write a file that reads differently
        raise ConfigError(f"{path}: could not set theme = {name!r}")
    # through a symlinked config (dotfile repos) to its target, atomically, mode kept
    write_atomic(path, new.encode("utf-8"), new_mode=0o600, parent_mode=0o777)
    config.theme = name
    if config.path is None:
        config.path = path
    return path
