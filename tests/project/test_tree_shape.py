"""The tree keeps the shape ARCHITECTURE.md describes: a few modules at the top of console/ and
engine/, subpackages of a readable size, no module over 600 lines and no function over 80 lines
outside tests/ (a long one is split into named steps)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.paths import REPO as ROOT

TOP_MODULES, PACKAGE_MODULES, MODULE_LINES, FUNCTION_LINES = 13, 20, 600, 80


def python_files(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts)


def long_functions(path: Path, limit: int) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            n = (node.end_lineno or node.lineno) - start + 1
            if n > limit:
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
                out.append(f"{where}:{node.lineno} {node.name} ({n} lines)")
    return out


@pytest.mark.parametrize("package", ["console", "engine"])
def test_packages_stay_small(package: str) -> None:
    top = list((ROOT / package).glob("*.py"))
    assert len(top) <= TOP_MODULES, f"{package}/ has {len(top)} modules at its top"
    for sub in (ROOT / package).iterdir():
        if (sub / "__init__.py").is_file():
            n = len(list(sub.glob("*.py")))
            assert n <= PACKAGE_MODULES, f"{sub.relative_to(ROOT)}/ has {n} modules"


def test_no_module_over_600_lines() -> None:
    big = [f"{p.relative_to(ROOT)} ({n} lines)" for p in python_files("console", "engine",
                                                                        "benchmarks")
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MODULE_LINES]
    assert big == []


def test_no_function_over_80_lines() -> None:
    found = [f for p in python_files("console", "engine", "benchmarks")
             for f in long_functions(p, FUNCTION_LINES)]
    assert found == []


def test_the_checker_sees_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    f = tmp_path / "probe.py"
    f.write_text(f"def too_long():\n{body}\n\ndef short():\n    pass\n")
    want = f"probe.py:1 too_long ({FUNCTION_LINES + 1} lines)"
    assert long_functions(f, FUNCTION_LINES) == [want]
