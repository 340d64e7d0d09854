"""A pipeline's charts in its run detail, over the seconds since the stream's first figure:
the producer's samples per second, the trainer's tokens per second, the pool's depth in
samples and in MiB, and the share of the time each side waited (the producer paused on a full
pool, the trainer waiting for a sample): the side that waits is the one to give less, the
other the one to give more GPUs. The figures come parsed (console/runs/stream_figures.py)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal

from console.runs.stream_figures import StreamFigures
from console.widgets.line_plot import LinePlot

#: the charts: (id, title)
CHARTS = (("stream-produced", "producer samples/s"), ("stream-tokens", "trainer tokens/s"),
          ("stream-pool", "pool samples"), ("stream-bytes", "pool MiB"),
          ("stream-wait", "waiting"))
PAUSED = "producer paused"
WAITED = "trainer waited"


class StreamCharts(Horizontal):
    """Five small plots side by side (module docstring)."""

    def compose(self) -> ComposeResult:
        for wid, title in CHARTS:
            yield LinePlot(title, x_label="s", id=wid)

    def show(self, producer: StreamFigures, trainer: StreamFigures) -> None:
        """Draw what the producer's and the trainer's events said (either may be empty)."""
        starts = [t for t in (producer.first_t(), trainer.first_t()) if t is not None]
        t0 = min(starts) if starts else 0.0

        def plot(wid: str) -> LinePlot:
            return self.query_one(f"#{wid}", LinePlot)

        plot("stream-produced").show([("samples/s", producer.produced_rate(t0))], y_min=0.0)
        plot("stream-tokens").show([("tokens/s", trainer.tokens_rate(t0))], y_min=0.0)
        plot("stream-pool").show([("samples", producer.pool_samples(t0))], y_min=0.0)
        plot("stream-bytes").show([("MiB", producer.pool_mib(t0))], y_min=0.0)
        plot("stream-wait").show([(PAUSED, producer.paused_share(t0)),
                                  (WAITED, trainer.wait_share(t0))], y_min=0.0, y_max=1.0)
