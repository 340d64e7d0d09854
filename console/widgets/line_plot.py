"""A line plot drawn with braille dots (2 x 4 per cell): training curves in the run detail,
and `StreamCharts`, a pipeline's row of them (see its comment).

`LinePlot.show(series, ...)` takes (name, points) pairs; the first row is the title with each
series' latest value in its colour, then the plot with its y range on the left and the step
(or seconds) range under it. Colours come from the `plot--s0` ... `plot--s7` component classes
(set in themes/runs.tcss from theme variables); a cell shared by two series takes the later
one's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widget import Widget

from console.runs.stream_figures import StreamFigures

# braille dot bits by (x, y) inside a cell: x 0-1, y 0-3 (top first)
_DOTS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
Points = Sequence[tuple[float, float]]
N_COLOURS = 8
Y_LABEL = 7


def braille_grid(series: Sequence[Points], width: int, height: int,
                 x_range: tuple[float, float], y_range: tuple[float, float]
                 ) -> list[list[tuple[int, int]]]:
    """Cells (dot bits, index of the series that drew last there, -1 if none), top row first.

    Consecutive points of a series are joined by straight lines in dot space; a point that is
    not a finite number (a diverged loss: NaN) is not drawn and breaks the line."""
    grid = [[(0, -1)] * width for _ in range(height)]
    if width <= 0 or height <= 0:
        return grid
    (x0, x1), (y0, y1) = x_range, y_range
    dw, dh = width * 2, height * 4
    sx = (dw - 1) / (x1 - x0) if x1 > x0 else 0.0
    sy = (dh - 1) / (y1 - y0) if y1 > y0 else 0.0

    def dot(px: int, py: int, k: int) -> None:
        if 0 <= px < dw and 0 <= py < dh:
            row, col = py // 4, px // 2
            bits, _ = grid[row][col]
            grid[row][col] = (bits | _DOTS[px % 2][py % 4], k)

    for k, pts in enumerate(series):
        prev: tuple[int, int] | None = None
        for x, y in pts:
            if not (math.isfinite(x) and math.isfinite(y)):
                prev = None
                continue
            px = round((x - x0) * sx) if sx else 0
            py = dh - 1 - (round((min(max(y, y0), y1) - y0) * sy) if sy else dh // 2)
            if prev is None:
                dot(px, py, k)
            else:
                _line(prev, (px, py), lambda a, b, k=k: dot(a, b, k))
            prev = (px, py)
    return grid


def _line(a: tuple[int, int], b: tuple[int, int], put: object) -> None:
    """Bresenham from a to b (both ends included)."""
    (x0, y0), (x1, y1) = a, b
    dx, dy = abs(x1 - x0), -abs(y1 - y0)
    sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
    err = dx + dy
    while True:
        put(x0, y0)  # type: ignore[operator]
        if x0 == x1 and y0 == y1:
            return
        e2 = 2 * err
        if e2 >= dy:
            err += dy
            x0 += sx
        if e2 <= dx:
            err += dx
            y0 += sy


def fmt_value(v: float) -> str:
    a = abs(v)
    if a >= 1000:
        return f"{v:.3g}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.3f}"


class LinePlot(Widget):
    """Title row + braille plot + step axis (module docstring)."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        *(f"plot--s{i}" for i in range(N_COLOURS)), "plot--axis", "plot--title", "plot--empty"}
    DEFAULT_CSS = "LinePlot { height: 8; }"

    def __init__(self, title: str, x_label: str = "step", **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.title = title
        self.x_label = x_label      # what the x axis counts: steps, or seconds ("s")
        self.series: list[tuple[str, list[tuple[float, float]]]] = []
        self.x_range: tuple[float, float] | None = None
        self.y_fixed: tuple[float | None, float | None] = (None, None)

    def show(self, series: Sequence[tuple[str, Points]],
             x_range: tuple[float, float] | None = None,
             y_min: float | None = None, y_max: float | None = None) -> None:
        """Replace what is drawn; x_range defaults to the data's steps, y to the data's values
        (y_min / y_max pin either end, e.g. 0 and 1 for accuracies). Points that are not
        finite numbers are left out: they have no place on the axes."""
        self.series = [(name, [(x, y) for x, y in pts if math.isfinite(x) and math.isfinite(y)])
                       for name, pts in series]
        self.x_range = x_range
        self.y_fixed = (y_min, y_max)
        self.refresh()

    @property
    def point_count(self) -> int:
        return sum(len(p) for _, p in self.series)

    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(name, partial=True)

    def ranges(self) -> tuple[tuple[float, float], tuple[float, float]] | None:
        xs = [x for _, pts in self.series for x, _ in pts]
        ys = [y for _, pts in self.series for _, y in pts]
        if not xs:
            return None
        xr = self.x_range or (min(xs), max(xs))
        lo = self.y_fixed[0] if self.y_fixed[0] is not None else min(ys)
        hi = self.y_fixed[1] if self.y_fixed[1] is not None else max(ys)
        if hi - lo < 1e-9:
            lo, hi = lo - 0.5, hi + 0.5
        return (xr[0], max(xr[1], xr[0] + 1)), (lo, hi)

    def title_line(self, width: int) -> tuple[str, list[tuple[int, str]]]:
        """The title and each series' latest value, (series index, label) each, in `width`
        columns where a shorter form fits: the whole, then without the plot's title, then with
        each series named by its first word (`train` for `train (est.)`). Never a value cut."""
        last = [(k, name, fmt_value(pts[-1][1])) for k, (name, pts) in enumerate(self.series)
                if pts]
        if len(self.series) <= 1:
            return self.title, [(k, f"  {v}") for k, _n, v in last]
        forms = [(self.title, [(k, f"  {n} {v}") for k, n, v in last]),
                 ("", [(k, f"{'  ' if i else ''}{n} {v}") for i, (k, n, v) in enumerate(last)]),
                 ("", [(k, f"{' ' if i else ''}{n.split(' (')[0]} {v}")
                       for i, (k, n, v) in enumerate(last)])]
        for title, labels in forms:
            if cell_len(title + "".join(lb for _k, lb in labels)) <= width:
                return title, labels
        return forms[-1]

    def render(self) -> Text:
        w, h = self.size.width, self.size.height
        out = Text(no_wrap=True, overflow="crop")
        title, labels = self.title_line(w)
        out.append(title, self._style("plot--title"))
        for k, label in labels:
            out.append(label, self._style(f"plot--s{k % N_COLOURS}"))
        rng = self.ranges()
        rows = max(0, h - 2)
        cols = max(0, w - Y_LABEL)
        if rng is None:
            out.append("\n" + "waiting for the first metrics…", self._style("plot--empty"))
            return out
        (x0, x1), (y0, y1) = rng
        grid = braille_grid([pts for _, pts in self.series], cols, rows, (x0, x1), (y0, y1))
        axis = self._style("plot--axis")
        for r, cells in enumerate(grid):
            out.append("\n")
            label = fmt_value(y1) if r == 0 else fmt_value(y0) if r == rows - 1 else ""
            out.append(label[:Y_LABEL - 1].rjust(Y_LABEL - 1) + "│", axis)
            for bits, k in cells:
                if k < 0:
                    out.append(" ")
                else:
                    out.append(chr(0x2800 + bits), self._style(f"plot--s{k % N_COLOURS}"))
        left, right = f"{self.x_label} {x0:.0f}", f"{x1:.0f}"
        out.append("\n" + " " * Y_LABEL + left + right.rjust(max(1, cols - len(left))), axis)
        return out


# -- a pipeline's charts ------------------------------------------------------------------------
# Over the seconds since the stream's first figure: the producer's samples per second, the
# trainer's tokens per second, the pool's depth in samples and in MiB, and the share of the time
# each side waited (the producer paused on a full pool, the trainer waiting for a sample): the
# side that waits is the one to give less, the other the one to give more GPUs. The figures
# come parsed (console/runs/stream_figures.py).

#: the charts: (id, title)
CHARTS = (("stream-produced", "producer tokens/s"), ("stream-tokens", "trainer tokens/s"),
          ("stream-pool", "pool samples"), ("stream-bytes", "pool MiB"),
          ("stream-wait", "waiting"))
PAUSED = "producer paused"
WAITED = "trainer waited"


class StreamCharts(Horizontal):
    """Five small plots side by side (the comment above)."""

    def compose(self) -> ComposeResult:
        for wid, title in CHARTS:
            yield LinePlot(title, x_label="s", id=wid)

    def show(self, producer: StreamFigures, trainer: StreamFigures) -> None:
        """Draw what the producer's and the trainer's events said (either may be empty)."""
        starts = [t for t in (producer.first_t(), trainer.first_t()) if t is not None]
        t0 = min(starts) if starts else 0.0

        def plot(wid: str) -> LinePlot:
            return self.query_one(f"#{wid}", LinePlot)

        plot("stream-produced").show([("tokens/s", producer.produced_rate(t0))], y_min=0.0)
        plot("stream-tokens").show([("tokens/s", trainer.tokens_rate(t0))], y_min=0.0)
        plot("stream-pool").show([("samples", producer.pool_samples(t0))], y_min=0.0)
        plot("stream-bytes").show([("MiB", producer.pool_mib(t0))], y_min=0.0)
        plot("stream-wait").show([(PAUSED, producer.paused_share(t0)),
                                  (WAITED, trainer.wait_share(t0))], y_min=0.0, y_max=1.0)
