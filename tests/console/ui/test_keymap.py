"""The key map (console/ui/keymap.py) is the only place keys are declared: every binding of every
console class comes from it, help lists every key of it and every key the README documents,
and the footer never shows one label twice."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import console
from console.dialogs.help import flat, sections
from console.ui.keymap import KEYS, PANES, SECTIONS, key_display
from tests.paths import REPO

README = REPO / "README.md"


def console_classes() -> list[type]:
    out = []
    for info in pkgutil.walk_packages(console.__path__, "console."):
        if ".hostside" in info.name or info.name.endswith("__main__"):  # server helpers; the CLI
            continue
        mod = importlib.import_module(info.name)
        out += [c for _n, c in inspect.getmembers(mod, inspect.isclass)
                if c.__module__ == mod.__name__ and "BINDINGS" in c.__dict__]
    return out


def test_every_binding_of_every_class_is_in_the_key_map() -> None:
    declared = {(k.keys, k.action, k.label, k.footer) for k in KEYS if k.bound}
    classes = console_classes()
    assert len(classes) >= 15, classes     # the walk found the panes, widgets and screens
    for cls in classes:
        for b in cls.__dict__["BINDINGS"]:
            assert not isinstance(b, tuple), f"{cls.__name__}: a tuple binding, not the map's"
            assert (b.key, b.action, b.description, b.show) in declared, (cls.__name__, b)


def test_help_lists_every_key_of_the_map_in_its_section() -> None:
    rows = flat(sections())
    for k in KEYS:
        title = SECTIONS[k.section]
        want = f"1-{len(PANES)}" if k.keys.isdigit() else key_display(k.keys)
        assert any(t == title and set(want.split()) <= set(key.split())
                   for t, key, _d in rows), (title, want)
    assert not any(key == "1-9" for _t, key, _d in rows)
    assert any(t == "Everywhere" and "switch host" in d for t, _k, d in rows)


def readme_keys() -> list[tuple[str, str]]:
    """(where, key) of the README's Keys table, `where` carried down blank cells."""
    text = README.read_text(encoding="utf-8")
    table = text.split("### Keys", 1)[1].split("\n\n", 1)[0]
    out, where = [], ""
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[1] in ("key", "---"):
            continue
        where = cells[0] or where
        for key in re.findall(r"`([^`]+)`", cells[1]):
            out.append((where, key))
    return out


def test_help_shows_every_key_the_readme_documents() -> None:
    titles = {"everywhere": "Everywhere", **{t: f"{t} pane" for _i, t in PANES}}
    rows = flat(sections())
    documented = readme_keys()
    assert ("GPUs", "s") in documented and len(documented) >= 15
    for where, key in documented:
        key = "1-6" if key in ("1", "6") else key
        assert any(t == titles[where] and key in k.split() for t, k, _d in rows), (where, key)
