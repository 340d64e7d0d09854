"""The strip of live vLLM charts above the log: generation and prompt throughput, running and
waiting requests, KV cache usage, mean acceptance length, and per-position acceptance over time
(one shaded row per draft position). One column per stats line (vLLM logs one every 10 s by
default), newest at the right; or, when the host's /metrics has answered, one column per scrape
of its exact counters (console/logs/vllm_metrics.py gives them the log records' shape)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from console.logs.log_model import LogModel
from console.logs.vllm_log import EngineStats, SpecDecodeStats
from console.logs.vllm_metrics import MetricsHistory
from console.widgets.meter_base import MeterLine, MeterWidget
from console.widgets.meters import columns, fmt_si, shade

CHART_ROWS = 3
POSITIONS = 3  # draft positions drawn (the title says how many more there are)
#: what a chart is called where its whole title, figure and peak do not fit (80 columns)
SHORT_TITLES = {"generation tok/s": "gen tok/s", "prompt tok/s": "prompt t/s",
                "mean acceptance length": "accept len"}


def _fmt(v: float | None, digits: int = 0, unit: str = "") -> str:
    return "—" if v is None else f"{v:,.{digits}f}{unit}"


class ChartSource(Protocol):
    """What the charts draw: engine and spec-decode records, oldest first."""

    @property
    def engine(self) -> Sequence[EngineStats]: ...

    @property
    def spec(self) -> Sequence[SpecDecodeStats]: ...


class LogCharts(MeterWidget):
    """Six small charts in two rows of three."""

    DEFAULT_CSS = "LogCharts { height: 8; }"

    def __init__(self, model: LogModel, **kw: object) -> None:
        super().__init__(**kw)
        self.model = model
        self.metrics: MetricsHistory | None = None  # set by the pane for a host with /metrics
        self._seen: tuple[int, int, int] = (-1, -1, -1)
        self._drawn_at = 0.0

    @property
    def source(self) -> ChartSource:
        """The /metrics scrapes once there are any (exact counters beat rounded log lines)."""
        return self.metrics if self.metrics is not None and self.metrics.has_data else self.model

    def sync(self, force: bool = False) -> None:
        """Redraw when stats lines arrived, at most once a second (vLLM writes them every 10 s;
        a flood of them must not cost more)."""
        m = self.source
        seen = (id(m), id(m.engine[-1]) if m.engine else 0, id(m.spec[-1]) if m.spec else 0)
        now = time.monotonic()
        if force or (seen != self._seen and now - self._drawn_at >= 1.0):
            self._seen, self._drawn_at = seen, now
            self.redraw()

    def _fitting(self, width: int, *heads: list[tuple[str, str]]) -> MeterLine:
        """The first head (runs of text and style name) that fits `width`, else the last: a
        narrow terminal gets a shorter wording, never a figure cut in the middle."""
        pick = next((h for h in heads if sum(len(t) for t, _ in h) <= width), heads[-1])
        line = MeterLine()
        for text, style in pick:
            line.append(text, self.mstyle(style))
        return line

    def _chart(self, title: str, now: str, values: list[float | None], width: int,
               vmax: float | None = None, style: str = "spark") -> list[MeterLine]:
        top = max((v for v in values if v is not None), default=0.0)
        scale = vmax if vmax is not None else (top * 1.1 or 1.0)
        peak = [(f" ↑{fmt_si(top)}", "label")] if vmax is None and top else []
        short = SHORT_TITLES.get(title, title)
        head = self._fitting(width, [(title, "label"), (" " + now, "header"), *peak],
                             [(short, "label"), (" " + now, "header"), *peak],
                             [(short, "label"), (" " + now, "header")])
        rows = [head] + [MeterLine(r, self.mstyle(style))
                         for r in columns(values, width, CHART_ROWS, scale)]
        return [t.pad(width) for t in rows]

    def _requests(self, width: int) -> list[MeterLine]:
        engine = self.source.engine
        run = [e.running for e in engine]
        wait = [e.waiting for e in engine]
        last = engine[-1] if engine else None
        running, waiting = (_fmt(last.running if last else None),
                            _fmt(last.waiting if last else None))
        wait_style = "high" if last and last.waiting else "label"
        head = self._fitting(width, [("requests ", "label"), (f"{running} running", "header"),
                                     (f" {waiting} waiting", wait_style)],
                             [("req ", "label"), (f"{running} run", "header"),
                              (f" {waiting} wait", wait_style)])
        top = max([v for v in run + wait if v is not None] or [1])
        chart = columns([float(v) if v is not None else None for v in run], width, 2, top * 1.1)
        wait_row = columns([float(v) if v is not None else None for v in wait], width, 1, top * 1.1)
        rows = [head, MeterLine(chart[0], self.mstyle("spark")),
                MeterLine(chart[1], self.mstyle("spark")),
                MeterLine(wait_row[0], self.mstyle("spark2"))]
        return [t.pad(width) for t in rows]

    def _positions(self, width: int) -> list[MeterLine]:
        spec = self.source.spec
        k = max((len(s.per_position) for s in spec), default=0)
        figures: list[tuple[str, str]] = []
        if spec and spec[-1].per_position:
            figures.append((" ".join(f"{p:.2f}" for p in spec[-1].per_position[:POSITIONS]),
                            "header"))
            if k > POSITIONS:
                figures.append((f" +{k - POSITIONS}", "label"))
        head = self._fitting(width, [("accept/position ", "label"), *figures],
                             [("acc/pos ", "label"), *figures])
        rows = [head]
        label_w = 3
        for i in range(POSITIONS):
            row = MeterLine()
            row.append(f"{i:<{label_w}}", self.mstyle("label"))
            vals = [s.per_position[i] if len(s.per_position) > i else None for s in spec]
            row.append(shade(vals, width - label_w) if i < k else "", self.mstyle("spark2"))
            rows.append(row)
        return [t.pad(width) for t in rows]

    def lines(self) -> list[MeterLine]:
        gap = 2
        w = max(10, (self.size.width - 2 * gap) // 3)
        eng, spec = self.source.engine, self.source.spec
        last_e = eng[-1] if eng else None
        last_s = spec[-1] if spec else None
        k = max((len(s.per_position) for s in spec), default=0)
        top_row = [
            self._chart("generation tok/s", _fmt(last_e.generation_throughput if last_e else None,
                                                 1), [e.generation_throughput for e in eng], w),
            self._chart("prompt tok/s", _fmt(last_e.prompt_throughput if last_e else None, 1),
                        [e.prompt_throughput for e in eng], w),
            self._requests(w),
        ]
        bottom_row = [
            self._chart("KV cache", _fmt(last_e.kv_cache_usage_pct if last_e else None, 1, "%"),
                        [e.kv_cache_usage_pct for e in eng], w, 100.0, "mid"),
            self._chart("mean acceptance length", _fmt(
                last_s.mean_acceptance_length if last_s else None, 2),
                [s.mean_acceptance_length for s in spec], w, float(k + 1) if k else None),
            self._positions(w),
        ]
        lines = []
        for block in (top_row, bottom_row):
            for r in range(CHART_ROWS + 1):
                line = MeterLine()
                for i, chart in enumerate(block):
                    if i:
                        line.append(" " * gap)
                    line.extend(chart[r])
                lines.append(line)
        if not eng and not spec:
            lines[1] = MeterLine("  no vLLM stats lines yet (vLLM logs them every 10 s while "
                                 "serving)", self.mstyle("stale"))
        return lines
