"""What the prose cites is there: every `docs/...` file (and `#section` of one) named in the
README, ARCHITECTURE.md, docs/ or the code (tests hold paths as data) exists; every module path
(`engine/ckpt/vocab.py`) and dotted name (`engine.capture.swap_backend.SwapExtension`) in the
markdown names a module, and an attribute defined at its top level. The code cites these,
never anything outside the repository."""

from __future__ import annotations

import ast
import re
import subprocess
from functools import cache
from pathlib import Path

from tests.paths import REPO as ROOT

DOCS = re.compile(r"\b(docs/[\w./-]+\.(?:md|py|svg))(#[\w-]+)?")
MODULE_PATH = re.compile(r"(?<![\w/.])((?:console|engine|benchmarks|tests)/[\w/]+\.py)\b")
DOTTED = re.compile(r"(?<![\w./-])((?:console|engine)(?:\.\w+)+)")
#: words the prose puts after a package name that are not modules ("engine.events-style")
OUTSIDE = ("http://", "https://")


def markdown() -> list[Path]:
    return [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]


def sources() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "console", "engine",
                          "benchmarks", "Makefile", ".ci"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / p for p in out if p.endswith((".py", ".sh", "Makefile", "run"))
            and (ROOT / p).is_file()]


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings."""
    out = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


@cache
def top_level_names(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def dotted_exists(name: str) -> bool:
    """A module (file or package), or a module and one top-level name of it."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else \
            base / "__init__.py" if (base / "__init__.py").is_file() else None
        if module is None:
            continue
        rest = parts[cut:]
        return not rest or len(rest) == 1 and rest[0] in top_level_names(module)
    return False


def test_every_cited_docs_file_and_section_exists() -> None:
    stale = []
    for path in markdown() + sources():
        text = path.read_text(encoding="utf-8")
        for m in DOCS.finditer(text):
            page = ROOT / m.group(1)
            if not page.is_file():
                stale.append(f"{path.relative_to(ROOT)}: {m.group(0)}")
            elif m.group(2) and m.group(2)[1:] not in anchors(page):
                stale.append(f"{path.relative_to(ROOT)}: {m.group(0)} (no such section)")
    assert stale == [], stale


def test_every_module_the_markdown_names_exists() -> None:
    stale = []
    for path in markdown():
        text = path.read_text(encoding="utf-8")
        for m in MODULE_PATH.finditer(text):
            if not (ROOT / m.group(1)).is_file():
                stale.append(f"{path.relative_to(ROOT)}: {m.group(1)}")
        for m in DOTTED.finditer(text):
            name = m.group(1).rstrip(".")
            if not dotted_exists(name):
                stale.append(f"{path.relative_to(ROOT)}: {name}")
    assert stale == [], stale


def test_relative_links_in_the_markdown_resolve() -> None:
    stale = []
    for path in markdown():
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text(encoding="utf-8")):
            if target.startswith(OUTSIDE) or target.startswith("#"):
                continue
            if not (path.parent / target.split("#")[0]).exists():
                stale.append(f"{path.relative_to(ROOT)}: {target}")
    assert stale == [], stale


#: a citation of a text outside the repository: the spec sheet, or a tracker issue by number
OUTSIDE_CITATION = re.compile(r"spec[ -]?sheet|eagle3-spec|\bspec (?:section|sections|\d)|"
                              r"\bissues? #?\d+", re.IGNORECASE)


def cited_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "console", "engine",
                          "benchmarks", "tests", "docs", "README.md", "ARCHITECTURE.md"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    own = Path(__file__).resolve()
    return [ROOT / p for p in out if p.endswith((".py", ".md", ".sh"))
            and (ROOT / p).is_file() and (ROOT / p).resolve() != own]


def test_no_citation_points_outside_the_repository() -> None:
    """The facts the code relies on are in docs/eagle3.md; nothing cites the spec sheet or an
    issue number, which a reader of the repository cannot open."""
    found = []
    for path in cited_files():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if m := OUTSIDE_CITATION.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {m.group(0)}")
    assert found == [], found
