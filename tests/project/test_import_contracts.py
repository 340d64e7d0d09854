"""The import contracts, in one place: the console runs without torch and the engine without
textual/asyncssh; no import cycle in console/ or engine/; imports run from a layer down to the
same or a lower one, never back up (a pane may import a service, never the reverse); a layer
is a whole package, and modal screens live below the panes (dialogs), full screens above them
(screens); panes, screens, dialogs and widgets never import a transport; the console reads the
engine only through its contract modules (the event stream, the inspect report, the reading of
an HTTP error answer); and no module of tests/ imports a test module (what tests share lives in
a helper module of tests/).

The graph is read from the source with ast (nothing is imported): every `import` counts, at
module level or inside a function (a function-local import that closes a cycle only hides it),
except under TYPE_CHECKING. Cycles are the strongly connected components of more than one
module (Tarjan)."""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.paths import REPO as ROOT

#: the console's layers, lowest first: a module may import its own layer or a lower one. The
#: ui group (keymap, messages, palette, themes, services) sits under widgets, dialogs, panes and
#: screens; the dialogs (modal screens a pane or the app opens) sit under the panes.
CONSOLE_LAYERS: list[tuple[str, ...]] = [
    ("console", "console.errors", "console.hostside"),
    ("console.settings",),
    ("console.transport",),
    ("console.hosts",),
    ("console.scheduler", "console.logs", "console.monitor"),
    ("console.runs", "console.demo"),
    ("console.checkpoints",),
    ("console.commands", "console.ui"),
    ("console.widgets",),
    ("console.dialogs",),
    ("console.panes",),
    ("console.screens",),
    ("console.app",),
    ("console.cli", "console.__main__"),
]
#: the engine's layers, lowest first
ENGINE_LAYERS: list[tuple[str, ...]] = [
    ("engine", "engine.errors", "engine.fileio", "engine.events", "engine.progress_bar",
     "engine.dist", "engine.monitor", "engine.inspect_report", "engine.http_reason"),
    ("engine.model",),
    ("engine.ckpt",),
    ("engine.data",),
    ("engine.stream",),
    ("engine.capture",),
    ("engine.training",),
    ("engine.demo",),
    ("engine.commands",),
    ("engine.cli", "engine.__main__"),
]
#: all the console may import of the engine: the event stream, the inspect report's text and
#: the reading of an HTTP error answer (standard library only)
ENGINE_CONTRACT = {"engine.events", "engine.inspect_report", "engine.http_reason"}
TUI = ("console.panes", "console.screens", "console.dialogs", "console.widgets")


def modules(package: str) -> dict[str, Path]:
    out = {}
    for p in sorted((ROOT / package).rglob("*.py")):
        parts = p.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def raw_imports(name: str, path: Path) -> set[str]:
    """Every dotted name `name` imports anywhere (TYPE_CHECKING blocks left out), with each
    `from M import a` also giving `M.a` (a submodule, when it is one)."""
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    pkg = name.split(".")
                    pkg = pkg[:len(pkg) - child.level + (1 if is_pkg else 0)]
                    base = ".".join([*pkg, *([base] if base else [])])
                found.add(base)
                found.update(f"{base}.{a.name}" for a in child.names)  # submodules
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Modules of `known` that `name` imports anywhere."""
    return {m for m in raw_imports(name, path) if m in known and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def import_graph(package: str) -> dict[str, set[str]]:
    known = modules(package)
    return {m: imports(m, p, known) for m, p in known.items()}


def layer_of(module: str, layers: list[tuple[str, ...]]) -> int:
    """The layer of the longest prefix of `module` named in `layers`."""
    best, depth = -1, -1
    for i, names in enumerate(layers):
        for n in names:
            if (module == n or module.startswith(n + ".")) and n.count(".") > depth:
                best, depth = i, n.count(".")
    assert best >= 0, f"{module} is in no layer: add its package to the layer list"
    return best


def upward(graph: dict[str, set[str]], layers: list[tuple[str, ...]]) -> list[str]:
    return sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                  if layer_of(d, layers) > layer_of(m, layers))


def imports_of_test_modules(graph: dict[str, set[str]]) -> list[str]:
    """`a -> b` for every module of the graph importing a test module (tests.<...>.test_*)."""
    return sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                  if d != m and d.rsplit(".", 1)[-1].startswith("test_"))


def _py(code: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


# -- the checks can fail ----------------------------------------------------------------------

def test_the_finder_sees_a_cycle_held_by_a_function_local_import(tmp_path: Path) -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    probe = tmp_path / "x.py"
    probe.write_text("if TYPE_CHECKING:\n    import console.y\n"
                     "def f():\n    from console.ui.keymap import KEYS\n", encoding="utf-8")
    known = {m: probe for m in ("console.ui.keymap", "console.x", "console.y")}
    assert imports("console.x", probe, known) == {"console.ui.keymap"}


def test_the_layer_check_sees_an_import_back_up() -> None:
    graph = {"console.hosts.host": {"console.panes.runs"}, "console.panes.runs": set()}
    assert upward(graph, CONSOLE_LAYERS) == ["console.hosts.host -> console.panes.runs"]
    graph = {"engine.ckpt.vocab": {"engine.model.draft"}, "engine.model.draft": set()}
    assert upward(graph, ENGINE_LAYERS) == []


def test_the_test_module_check_sees_a_function_local_import(tmp_path: Path) -> None:
    probe = tmp_path / "test_b.py"
    probe.write_text("def test_x():\n    from tests.console.test_a import helper\n",
                     encoding="utf-8")
    known = {m: probe for m in ("tests.console.test_a", "tests.engine.test_b", "tests.panes")}
    graph = {"tests.engine.test_b": imports("tests.engine.test_b", probe, known),
             "tests.panes": set()}
    assert imports_of_test_modules(graph) == ["tests.engine.test_b -> tests.console.test_a"]


# -- the contracts ----------------------------------------------------------------------------

@pytest.mark.parametrize("package", ["console", "engine"])
def test_no_import_cycle(package: str) -> None:
    found = cycles(import_graph(package))
    assert found == [], f"import cycles in {package}/: {found}"


@pytest.mark.parametrize("package,layers", [("console", CONSOLE_LAYERS),
                                            ("engine", ENGINE_LAYERS)])
def test_imports_never_run_back_up_a_layer(package: str, layers: list[tuple[str, ...]]) -> None:
    assert upward(import_graph(package), layers) == []


def test_the_layers_are_whole_packages() -> None:
    """A layer names a package or a top-level module, never one module of a package: a module
    that sits apart from its package belongs in a package of its own."""
    for root, layers in (("console", CONSOLE_LAYERS), ("engine", ENGINE_LAYERS)):
        parts = [n for names in layers for n in names]
        assert [n for n in parts if n.count(".") > 1] == [], root
        assert [n for n in parts if n != root and not (ROOT / n.replace(".", "/")).is_dir()
                and not (ROOT / (n.replace(".", "/") + ".py")).is_file()] == [], root


def screen_classes(package: str) -> dict[str, set[str]]:
    """Each module's Screen and ModalScreen subclasses, by the base they name."""
    out: dict[str, set[str]] = {}
    for m, p in modules(package).items():
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(n, ast.ClassDef):
                for b in n.bases:
                    base = ast.unparse(b).split("[")[0].rsplit(".", 1)[-1]
                    if base in ("Screen", "ModalScreen"):
                        out.setdefault(base, set()).add(m)
    return out


def test_dialogs_hold_the_modal_screens_and_screens_the_full_ones() -> None:
    """A modal screen is opened over the panes, so it sits below them in console/dialogs; a
    full screen holds the panes, so it sits above them in console/screens."""
    found = screen_classes("console")
    assert found["ModalScreen"] and found["Screen"]
    assert sorted(m for m in found["ModalScreen"] if not m.startswith("console.dialogs.")) == []
    assert sorted(m for m in found["Screen"] if not m.startswith("console.screens.")) == []


def test_panes_screens_and_widgets_never_import_a_transport() -> None:
    bad = sorted(f"{m} -> {d}" for m, p in modules("console").items() if m.startswith(TUI)
                 for d in raw_imports(m, p) if d.startswith(("console.transport", "asyncssh")))
    assert bad == []


def test_panes_screens_and_widgets_never_call_a_transport() -> None:
    """They ask a service (the host, a follower, the metrics service); `.transport` is theirs."""
    bad = sorted(f"{m}:{n.lineno}" for m, p in modules("console").items() if m.startswith(TUI)
                 for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                 if isinstance(n, ast.Attribute) and n.attr == "transport")
    assert bad == []


def test_the_console_reads_the_engine_only_through_its_contract() -> None:
    used = {d for m, p in modules("console").items() for d in raw_imports(m, p)
            if d.startswith("engine.")}
    # `from engine import events` names the package and the module, `from engine.events import
    # parse` the module and a name in it: each must be a contract module or inside one
    outside = sorted(d for d in used if not any(d == c or d.startswith(c + ".")
                                                for c in ENGINE_CONTRACT))
    assert outside == []
    for name in ENGINE_CONTRACT:  # and the contract itself is standard library only
        deps = raw_imports(name, ROOT / (name.replace(".", "/") + ".py"))
        assert {d.split(".")[0] for d in deps} <= {"__future__", "json", "sys", "time", "typing",
                                                   "dataclasses", "collections", "os", "engine",
                                                   "threading", "math", "io", "collections.abc"}


def test_every_subcommand_connects_through_the_one_pool_the_cli_opens() -> None:
    """console/cli.py opens one HostPool (`async with`) and hands it to the subcommand's `run`,
    so whatever a subcommand connected is closed however it ends; none opens its own."""
    own = sorted(m for m, p in modules("console").items() if m.startswith("console.commands.")
                 for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                 and n.func.id == "HostPool")
    assert own == []
    from console.cli import COMMANDS
    takes = {name: list(inspect.signature(importlib.import_module(mod).run).parameters)
             for name, mod in COMMANDS.items()}
    assert {n: p for n, p in takes.items() if p != ["args", "config", "pool"]} == {}


def test_the_hostside_helpers_import_nothing_of_ours() -> None:
    """console/hostside runs on the host's own Python, before anything else is there."""
    for m, p in modules("console").items():
        if m.startswith("console.hostside"):
            ours = {d for d in raw_imports(m, p) if d.split(".")[0] in ("console", "engine")}
            assert ours <= {d for d in ours if d.startswith("console.hostside")}, (m, ours)


def test_console_app_starts_without_importing_torch(tmp_path: Path) -> None:
    r = _py("""
        import asyncio, sys
        from console.cli import build_parser
        build_parser()                          # every subcommand module imported
        from console.app import create_app
        from console.settings.config import default_config
        async def main():
            app = create_app(default_config())
            async with app.run_test(size=(120, 40)) as pilot:
                await pilot.pause()
                await pilot.press("q")
        asyncio.run(main())
        heavy = sorted(m for m in sys.modules
                       if m.split('.')[0] in ('torch', 'transformers', 'safetensors'))
        print('HEAVY', heavy)
        assert not heavy, heavy
    """, {"XDG_CONFIG_HOME": str(tmp_path / "c"), "XDG_DATA_HOME": str(tmp_path / "d")})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "HEAVY []" in r.stdout


def test_engine_imports_no_textual_or_asyncssh() -> None:
    r = _py("""
        import sys, importlib, pkgutil
        import engine, engine.cli
        engine.cli.build_parser()               # every command module imported
        for m in pkgutil.walk_packages(engine.__path__, 'engine.'):
            if m.name != 'engine.__main__':      # that one runs the CLI
                importlib.import_module(m.name)
        bad = sorted(m for m in sys.modules
                     if m.split('.')[0] in ('textual', 'asyncssh', 'console'))
        print('BAD', bad)
        assert not bad, bad
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "BAD []" in r.stdout


def test_no_test_module_imports_another() -> None:
    assert imports_of_test_modules(import_graph("tests")) == []
