"""Text meters shared by the GPU, fleet and logs widgets: bars, sparklines and short numbers.

Pure functions returning strings; the widgets colour them with their component classes (so the
colours come from the theme's .tcss, never from here).
"""

from __future__ import annotations

from collections.abc import Iterable

_EIGHTHS = " ▏▎▍▌▋▊▉"
_SPARK = "▁▂▃▄▅▆▇█"


def bar(frac: float | None, width: int) -> tuple[str, str]:
    """(filled, empty) parts of a bar `width` cells wide, in eighths of a cell."""
    if frac is None:
        return "", "·" * width
    eighths = round(max(0.0, min(1.0, frac)) * width * 8)
    full, part = divmod(eighths, 8)
    filled = "█" * full + (_EIGHTHS[part] if part else "")
    return filled, " " * (width - len(filled))


def level(frac: float | None) -> str:
    """"low", "mid" or "high": which component class colours a value."""
    if frac is None or frac < 0.5:
        return "low"
    return "mid" if frac < 0.8 else "high"


def spark(points: Iterable[tuple[float, float | None]], t0: float, t1: float, width: int,
          vmax: float) -> str:
    """A sparkline of (t, value) points over the window [t0, t1]: one cell per time bucket, the
    bucket's largest value; a bucket with no data is a blank (gaps stay visible)."""
    if width <= 0 or t1 <= t0:
        return ""
    cells: list[float | None] = [None] * width
    span = (t1 - t0) / width
    last = width - 1
    for t, v in points:  # every point of every history line, every redraw: no calls here
        if v is None or t < t0 or t > t1:
            continue
        i = int((t - t0) / span)
        if i > last:
            i = last
        cur = cells[i]
        if cur is None or v > cur:
            cells[i] = v
    out = []
    for v in cells:
        if v is None:
            out.append(" ")
        else:
            frac = max(0.0, min(1.0, v / vmax)) if vmax > 0 else 0.0
            out.append(_SPARK[min(len(_SPARK) - 1, int(frac * len(_SPARK)))])
    return "".join(out)


def fmt_bytes(n: float | None, suffix: str = "") -> str:
    """Binary units, 3 significant figures at most: 512M, 1.5G, 141G, 7.0T."""
    if n is None:
        return "—"
    for unit in ("B", "K", "M", "G", "T", "P"):
        if abs(n) < 1024 or unit == "P":
            if unit == "B":
                return f"{n:.0f}{unit}{suffix}"
            return f"{n:.1f}{unit}{suffix}" if abs(n) < 10 else f"{n:.0f}{unit}{suffix}"
        n /= 1024
    return "—"  # pragma: no cover


def fmt_mem(used: int | None, total: int | None) -> str:
    """`126/140G`, `2.1/6.9T`: used and total in the largest unit that keeps total under 1000."""
    if used is None or total is None:
        return "—"
    for unit, scale in (("T", 2**40), ("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if total >= scale:
            d = 1 if total / scale < 10 else 0
            return f"{used / scale:.{d}f}/{total / scale:.{d}f}{unit}"
    return f"{used}/{total}B"


def fmt_num(v: float | None, unit: str = "", digits: int = 0) -> str:
    return "—" if v is None else f"{v:.{digits}f}{unit}"


def fmt_si(v: float) -> str:
    """850, 1.2k, 31k, 1.5M: a rate or count in 4 characters or so."""
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            x = v / scale
            return f"{x:.1f}{unit}" if x < 10 else f"{x:.0f}{unit}"
    return f"{v:.0f}"


def fmt_span(seconds: float) -> str:
    """`50 s`, `3 min`, `1.2 h`."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def fmt_age(seconds: float | None) -> str:
    return "never" if seconds is None else f"{fmt_span(seconds)} ago"


def columns(values: list[float | None], width: int, height: int, vmax: float) -> list[str]:
    """A bar chart `height` rows tall of the last `width` values (one column each, eighths of a
    cell of resolution), returned top row first. Missing values are blank columns."""
    vals = values[-width:] if width > 0 else []
    pad: list[float | None] = [None] * (width - len(vals))
    vals = pad + vals          # newest at the right edge
    rows = []
    for r in range(height - 1, -1, -1):                 # r = rows below this one
        out = []
        for v in vals:
            if v is None or vmax <= 0:
                out.append(" ")
                continue
            eighths = round(max(0.0, min(1.0, v / vmax)) * height * 8) - r * 8
            out.append("█" if eighths >= 8 else " " if eighths <= 0
                       else "▁▂▃▄▅▆▇"[eighths - 1])
        rows.append("".join(out))
    return rows


def shade(values: list[float | None], width: int) -> str:
    """The last `width` fractions (0-1) as shades, newest at the right: ' ░▒▓█'."""
    vals = values[-width:] if width > 0 else []
    pad: list[float | None] = [None] * (width - len(vals))
    vals = pad + vals
    return "".join(" " if v is None else " ░▒▓█"[min(4, max(0, round(v * 4)))]
                   for v in vals)


def count(n: int, noun: str) -> str:
    """`1 run`, `2 runs`, `1,204 lines` (the nouns used with it take an s)."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"
