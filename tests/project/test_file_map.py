"""The file map (docs/file-map.md) stays true: every package, every module (and every
`__init__.py` that holds more than its docstring), every shared test helper and every test
folder has a row, and every row names a path that exists. Test files are listed by folder."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

from tests.paths import REPO as ROOT

MAPPED = ("console", "engine", "benchmarks", "tests", "themes")


FILE_MAP = ROOT / "docs" / "file-map.md"


def is_test_file(p: Path) -> bool:
    return p.parts[0] == "tests" and p.name.startswith("test_") and p.suffix == ".py"


def map_rows() -> list[str]:
    rows = []
    for line in FILE_MAP.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\| (.+?) \| .+ \|$", line)
        if m and m.group(1) != "path" and not m.group(1).startswith("---"):
            rows += re.findall(r"`([^`]+)`", m.group(1))
    return rows


def tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", *MAPPED], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    return [Path(p) for p in out if (ROOT / p).is_file()]


def needs_row(p: Path) -> bool:
    if p.parts[0] == "tests" and ("__snapshots__" in p.parts or "fixtures" in p.parts
                                  and p.suffix != ".py"):
        return False
    if p.suffix == ".sh" or p.name == "palettes.toml":
        return True
    if p.suffix != ".py" or is_test_file(p):
        return False
    if p.name == "__init__.py":
        body = ast.parse((ROOT / p).read_text(encoding="utf-8")).body
        return len(body) > 1 or bool(body) and not isinstance(body[0], ast.Expr)
    return True


def covered(path: Path, rows: list[str]) -> bool:
    s = path.as_posix()
    return any(s == r or Path(s).match(r) for r in rows)


def test_every_file_and_package_has_a_row() -> None:
    rows = map_rows()
    files = tracked()
    missing = [p.as_posix() for p in files if needs_row(p) and not covered(p, rows)]
    packages = sorted({p.parent.as_posix() + "/" for p in files if p.name == "__init__.py"
                       and p.parts[0] in ("console", "engine")})
    missing += [d for d in packages if d not in rows and d.rstrip("/") not in ("console", "engine")]
    missing += sorted({p.parent.as_posix() + "/" for p in files if is_test_file(p)} - set(rows))
    assert missing == [], f"docs/file-map.md lacks rows for: {missing}"


def test_every_row_names_a_path_that_exists() -> None:
    stale = [r for r in map_rows()
             if not (list(ROOT.glob(r)) if "*" in r else (ROOT / r).exists())]
    assert stale == [], f"docs/file-map.md rows for paths that do not exist: {stale}"


def test_every_source_path_named_in_the_source_exists() -> None:
    """A docstring or comment that names `console/...py`, `engine/...py` or `tests/...py` names
    a file that is there (engine/formats.py was cited in four docstrings long after it was split
    up; test files move between the folders per subpackage). tests/project/ is left out: its
    tests hold made-up paths as data."""
    named = re.compile(r"\b((?:console|engine|tests)/[\w/]+\.py)\b")
    stale = sorted({f"{p}: {m}" for p in tracked() if p.suffix == ".py"
                    and p.parts[0] in ("console", "engine", "benchmarks", "tests")
                    and p.parts[:2] != ("tests", "project")
                    for m in named.findall((ROOT / p).read_text(encoding="utf-8"))
                    if not (ROOT / m).exists()})
    assert stale == [], stale


def test_the_command_registry_is_the_commands_folder() -> None:
    """console/cli.py registers exactly the modules in console/commands/ (an entry for a module
    that never existed was hidden by a find_spec guard)."""
    from console.cli import COMMANDS
    files = {p.stem for p in (ROOT / "console" / "commands").glob("*.py") if p.stem != "__init__"}
    assert set(COMMANDS) == files
    assert set(COMMANDS.values()) == {f"console.commands.{f}" for f in files}
