"""No import cycles in console/: every `import` counts, at module level or inside a function
(a function-local import that closes a cycle only hides it), except under TYPE_CHECKING.

The graph is read from the source with ast (nothing is imported), and its cycles are the
strongly connected components of more than one module (Tarjan)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UI = ("console.app", "console.ui.palette", "console.ui.keymap", "console.ui.messages",
      "console.screens", "console.panes", "console.widgets")


def modules(package: str = "console") -> dict[str, Path]:
    out = {}
    for p in sorted((ROOT / package).rglob("*.py")):
        parts = p.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Modules of `known` that `name` imports anywhere (TYPE_CHECKING blocks left out)."""
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
    return {m for m in found if m in known and m != name}


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


def import_graph(package: str = "console") -> dict[str, set[str]]:
    known = modules(package)
    return {m: imports(m, p, known) for m, p in known.items()}


def test_the_finder_sees_a_cycle_held_by_a_function_local_import(tmp_path: Path) -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    probe = tmp_path / "x.py"
    probe.write_text("if TYPE_CHECKING:\n    import console.y\n"
                     "def f():\n    from console.ui.keymap import KEYS\n", encoding="utf-8")
    known = {m: probe for m in ("console.ui.keymap", "console.x", "console.y")}
    assert imports("console.x", probe, known) == {"console.ui.keymap"}


def test_no_import_cycle_through_the_ui() -> None:
    """Screens, panes, widgets, the palette and the app: no cycle touches them."""
    ui = [c for c in cycles(import_graph()) if any(m.startswith(UI) for m in c)]
    assert ui == [], f"import cycles through the UI: {ui}"


def test_no_import_cycle_in_console() -> None:
    found = cycles(import_graph())
    assert found == [], f"import cycles in console/: {found}"
