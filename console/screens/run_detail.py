"""An opened run: progress with step, total and ETA; live plots of the loss, acc_i per TTT step
and the acceptance length (estimated on each training batch, measured on the held-out samples
at every checkpoint, and as a running vLLM served each checkpoint with `--eval-server`,
labelled apart); the last log lines; provenance. A run that reports
no metrics (a plain script) gets no plots: its log has the room.

A streamed run (a pipeline opened from its row, or a `stream-put` / `train --from-stream` run
alone) has the stream's charts instead of acc_i (line_plot.py StreamCharts): producer
tokens/s, trainer tokens/s, the pool in samples and MiB, and each side's waiting; a
pipeline's title names each part's state, and `x` stops all of its parts.

The screen renders a RunFeed (console/runs/watch.py) that the runs pane keeps following in the
background; it redraws twice a second, only when the feed moved. `escape` goes back (the feed
keeps following), `x` stops the run (a run that has ended says so), `q` quits.
"""

from __future__ import annotations

import re
import time
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Header, ProgressBar, Static

from console.checkpoints.serve_guard import argv_port, served_drafter
from console.dialogs.confirm import ConfirmScreen
from console.errors import ConsoleError, describe_error
from console.runs.pipeline import PipelineFeeds, parts_text, stop_any
from console.runs.progress import HELD_OUT, SERVED
from console.runs.watch import RunFeed
from console.scheduler.run_status import RunStatus
from console.ui.host_text import markup, plain
from console.ui.keymap import bindings
from console.ui.services import services
from console.widgets.footer import Footer
from console.widgets.host_strip import short_path
from console.widgets.line_plot import LinePlot, StreamCharts
from console.widgets.log_tail import LogTail
from console.widgets.run_tables import STATUS_MARK, fmt_duration, stop_outcome

STOP_GRACE_S = 10.0
#: the acceptance-length series: the trainer's estimate on each training batch (metric `tau`),
#: what it measured on held-out samples at each checkpoint (its log line), and what a running
#: vLLM counted with each checkpoint swapped in (train --eval-server: `served acceptance`)
TAU_TRAIN = "train (est.)"
TAU_HELD_OUT = "held-out"
TAU_SERVED = "served"


def progress_text(feed: RunFeed) -> str:
    """`step 37/150 · 25% · ETA 1:12 · 0.6 step/s` (or what the run has said so far)."""
    p = feed.progress
    if p.done is None and not feed.record.engine:   # a script or a server: its log says it all
        if feed.status != RunStatus.RUNNING:
            return "no progress events (not an engine run)"
        drafter = served_drafter(feed.record.argv)
        if drafter is not None:
            return f"serving {drafter} in vLLM on port {argv_port(feed.record.argv)} (its log " \
                   "below)"
        return "running (not an engine run: no progress events; its output below)"
    if p.done is None:
        return "waiting for the first progress event…" if feed.status == RunStatus.RUNNING else \
            "no progress events (it ended before its first step)"
    unit = p.unit or "it"
    parts = [f"{unit} {p.done}/{p.total}" if p.total else f"{unit} {p.done}"]
    frac = p.fraction
    if frac is not None:
        parts.append(f"{frac * 100:.0f}%")
    # a resumed run's rate and ETA are its last attempt's own: none before its first progress
    start = feed.record.start
    own = start is None or (p.progress_t is not None and p.progress_t >= start)
    if feed.status == RunStatus.RUNNING and own and p.eta_s is not None and frac is not None \
            and frac < 1:
        parts.append(f"ETA {fmt_duration(p.eta_s)}")
    if p.rate and own:
        parts.append(f"{p.rate:.2f} {unit}/s")
    return " · ".join(parts)


def fit_value(value: str, room: int) -> str:
    """A value in `room` columns: `PATH (format, sha256 PREFIX)` loses the start of its path
    (…/public-drafter), never the parenthesis with the hash; anything else ends in …"""
    if room <= 0 or len(value) <= room:
        return value
    m = re.fullmatch(r"(\S+) (\(.*\))", value)
    if m and len(m.group(2)) + 8 <= room:
        path, tail = m.groups()
        return f"{short_path(path, room - len(tail) - 1)} {tail}"
    return value[:room - 1] + "…"


def provenance_text(rows: list[tuple[str, str]], width: int) -> Content:
    """The provenance box: one row per line, each fitted to `width` columns (0: unknown)."""
    label = max((len(k) for k, _ in rows), default=0)
    room = width - label - 2 if width else 0
    return Content("\n").join(markup("[b]$k[/b]  $v", k=k.ljust(label), v=fit_value(v, room))
                               for k, v in rows)


class RunDetailScreen(Screen[None]):
    """One run, live (module docstring)."""

    KEY_SECTION: ClassVar[str] = "run_detail"   # its keys in console/ui/keymap.py
    BINDINGS: ClassVar[list[BindingType]] = list(bindings("run_detail"))

    def __init__(self, feed: RunFeed, pipeline: PipelineFeeds | None = None) -> None:
        super().__init__()
        self.feed = feed
        self.pipeline = pipeline
        self._drawn: tuple[object, ...] = ()

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="detail-body"):
            yield Static("", id="detail-title")
            with Horizontal(id="detail-progress-row"):
                yield ProgressBar(id="detail-bar", show_eta=False)
                yield Static("", id="detail-progress")
            with Horizontal(id="detail-plots"):
                yield LinePlot("loss", id="plot-loss")
                yield LinePlot("acceptance length", id="plot-tau")
            yield LinePlot("acc_i per TTT step", id="plot-acc")
            yield StreamCharts(id="detail-stream")
            with Horizontal(id="detail-bottom"):
                yield LogTail(id="detail-log")
                yield Static("", id="detail-prov")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.pipeline.id if self.pipeline else self.feed.run_id
        self.set_interval(0.5, self.refresh_view)
        self.refresh_view(force=True)
        self.call_after_refresh(self.refresh_view, True)   # again, at the laid-out width

    def refresh_view(self, force: bool = False) -> None:
        feed = self.feed
        now: float = services(self).clock()
        running = feed.status == RunStatus.RUNNING
        pipe = self.pipeline
        key = (feed.progress.version, feed.status, feed.notice, feed.following,
               int(now) if running else 0,
               (pipe.version, pipe.run().status, parts_text(pipe.run(), STATUS_MARK))
               if pipe else None)
        if key == self._drawn and not force:
            return
        self._drawn = key
        self._title(now)
        p = feed.progress
        bar = self.query_one("#detail-bar", ProgressBar)
        # full only when the run says how far it got, or succeeded: a run that failed before
        # its first step has no bar at all (it showed 100%)
        # a running server or script that reports no progress has none (it showed 0% forever)
        bar.display = bool(p.total) or feed.status == RunStatus.SUCCEEDED or \
            running and feed.record.engine
        if p.total:
            bar.update(total=p.total, progress=p.done or 0)
        else:
            bar.update(total=100, progress=0 if running else 100)
        self.query_one("#detail-progress", Static).update(plain(progress_text(feed)))
        self._plots()
        self.query_one(LogTail).show(list(p.lines))
        rows = feed.provenance()
        final = p.result.get("final") if p.result else None
        if final:   # before the command, which is last: the longest, and what gets cut
            at = next((i for i, (k, _v) in enumerate(rows) if k == "command"), len(rows))
            rows.insert(at, ("final", str(final)))
        prov = self.query_one("#detail-prov", Static)
        prov.update(provenance_text(rows, prov.content_size.width))

    def _plots(self) -> None:
        """The three plots, shown once the run has reported a metric (never, for a script)."""
        p = self.feed.progress
        pipe = self.pipeline
        producer = pipe.figures("producer") if pipe else p.stream
        trainer = pipe.figures("trainer") if pipe else p.stream
        streamed = pipe is not None or p.stream.streamed
        charts = self.query_one(StreamCharts)
        charts.display = streamed
        if streamed:
            charts.show(producer, trainer)
        self.query_one("#detail-plots").display = bool(p.series)
        self.query_one("#plot-acc").display = bool(p.series) and not streamed
        if not p.series:
            return
        x_range = (0.0, float(p.total)) if p.total and p.unit == "step" else None
        self.query_one("#plot-loss", LinePlot).show([("loss", p.points("loss"))], x_range)
        k = len(p.acc_names())
        # train and held-out always: the plot then names each (an empty one draws nothing);
        # served only for a run measured in a server (most are not)
        served = [(TAU_SERVED, p.points(SERVED))] if p.points(SERVED) else []
        self.query_one("#plot-tau", LinePlot).show(
            [(TAU_TRAIN, p.points("tau")), (TAU_HELD_OUT, p.points(HELD_OUT)), *served],
            x_range, y_min=1.0, y_max=float(k + 1) if k else None)
        self.query_one("#plot-acc", LinePlot).show(
            [(n, p.points(n)) for n in p.acc_names()], x_range, y_min=0.0, y_max=1.0)

    def on_resize(self) -> None:
        self.call_after_refresh(self.refresh_view, True)   # the provenance fits the new width

    def _title(self, now: float) -> None:
        feed, rec = self.feed, self.feed.record
        code = "" if rec.exit_code in (None, 0) else f" (exit {rec.exit_code})"
        status = rec.status.value + code
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(rec.start)) \
            if rec.start else "-"
        took_s = rec.elapsed(now)   # every attempt's running time
        took = fmt_duration(took_s) if took_s is not None else "-"
        line = markup("[b]$id[/b] on $host · $state · started $started · $took", id=rec.id,
                      host=rec.host, state=f"{STATUS_MARK.get(rec.status, '')} {status}",
                      started=started, took=took)
        if feed.notice:
            line += markup(" · [$warning]$notice[/]", notice=feed.notice)
        elif feed.following and rec.status == RunStatus.RUNNING:
            line += markup(" · [$success]live[/]")
        # the engine's error event, else why the host's runner could not start the command
        error = feed.progress.error or rec.failure
        if self.pipeline is not None:
            pipe = self.pipeline.run()
            line += markup("\npipeline [b]$id[/b] · $state · $parts", id=pipe.id,
                           state=pipe.status.value, parts=parts_text(pipe, STATUS_MARK))
        if error:
            line += markup("\n[$error]$error[/]", error=error)
        self.query_one("#detail-title", Static).update(line)

    def action_close(self) -> None:
        self.dismiss(None)

    def action_stop(self) -> None:
        pipe = self.pipeline.run() if self.pipeline else None
        status = pipe.status if pipe else self.feed.status
        if not status.active and not (pipe and pipe.lingering):
            self.notify(f"{pipe.id if pipe else self.feed.run_id} has already ended "
                        f"({status}): nothing to stop", severity="warning")
            return
        self.do_stop()

    @work(group="detail-stop", exclusive=True, exit_on_error=False)
    async def do_stop(self) -> None:
        run_id = self.pipeline.id if self.pipeline else self.feed.run_id
        if not await self.app.push_screen_wait(ConfirmScreen(markup(
                "Stop [b]$run[/b]?\n\nSIGTERM to its process group, SIGKILL after $grace s "
                "(longer while it swaps an eval server's drafter back).",
                run=run_id, grace=f"{STOP_GRACE_S:.0f}"), yes="Stop it")):
            return
        try:
            app = services(self)
            run = await stop_any(app.config, run_id, app.pool, grace=STOP_GRACE_S)
            feeds = self.pipeline.feeds.values() if self.pipeline else [self.feed]
            for f in feeds:
                await f.refresh_record()
            first = run.records[0] if run.records else None
            warning = first.stop_warning if first else ""
            self.notify(stop_outcome(run_id, run.status, first.refused if first else "",
                                     warning), severity="error" if warning else "information")
        except ConsoleError as e:
            self.notify(f"stop failed: {describe_error(e)}", severity="error")
        self.refresh_view(force=True)
