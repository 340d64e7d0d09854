"""What differs between two SVG snapshots, as text: a mismatch in CI (where the HTML report
cannot be opened) says which screen rows changed, or, when every row reads the same, which rows
changed colour or style."""

from __future__ import annotations

import html
import re

_TEXT = re.compile(r'<text class="([^"]*)" x="([\d.]+)" y="([\d.]+)"[^>]*>(.*?)</text>')
_RECT = re.compile(r'<rect fill="([^"]*)" x="([\d.]+)" y="([\d.]+)" width="([\d.]+)"')


def _rows(svg: str) -> dict[float, list[tuple[float, str, str]]]:
    rows: dict[float, list[tuple[float, str, str]]] = {}
    for cls, x, y, text in _TEXT.findall(svg):
        rows.setdefault(float(y), []).append((float(x), cls, html.unescape(text)))
    return rows


def screen_text(svg: str) -> list[str]:
    """The screen's rows as plain text, top to bottom."""
    rows = _rows(svg)
    return ["".join(t for _, _, t in sorted(rows[y])).replace("\xa0", " ") for y in sorted(rows)]


def _styles(svg: str) -> list[str]:
    """Each row's sequence of (style class, text) runs and the backgrounds drawn on it."""
    rows = _rows(svg)
    backs: dict[float, list[tuple[float, str, str]]] = {}
    for fill, x, y, width in _RECT.findall(svg):
        backs.setdefault(float(y), []).append((float(x), fill, width))
    # style class names are numbered per file: compare by each class's first use instead
    names: dict[str, str] = {}
    out = []
    for y in sorted(rows):
        runs = [f"{names.setdefault(c.split()[-1], f's{len(names)}')}:{t}"
                for _, c, t in sorted(rows[y])]
        out.append(" ".join(runs))
    out.extend(f"background y={y}: {sorted(backs[y])}" for y in sorted(backs))
    return out


def describe_difference(expected: str, actual: str, limit: int = 12) -> str:
    """A few lines saying what changed between the accepted snapshot and this screen."""
    want, got = screen_text(expected), screen_text(actual)
    lines = [f"row {i}: expected {a!r}\n        actual   {b!r}"
             for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b]
    if len(want) != len(got):
        lines.append(f"{len(want)} rows expected, {len(got)} drawn")
    if not lines:
        sw, sg = _styles(expected), _styles(actual)
        lines = ["every row reads the same; styles differ:"] + [
            f"  expected {a[:160]!r}\n  actual   {b[:160]!r}"
            for a, b in zip(sw, sg, strict=False) if a != b]
    return "\n".join(lines[:limit])
