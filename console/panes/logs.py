"""The logs pane: follows the selected host's configured logs (the vLLM server log above all),
then the logs of the vLLM servers `serve` runs there (each run's output.log), with live charts
of the vLLM stats lines above the text.

Keys: `f` follow/pause, `/` filter (Enter keeps it, Esc clears), `e` / `E` next / previous
error, `l` next configured log. A worker runs the LogFollower (console/logs/follow.py), polling as
often as the text redraws, and only appends batches to the LogModel; a 2 Hz timer redraws what
changed (1 Hz while a flood replaces the whole view each time), so thousands of lines per second
cost one or two redraws per second, and memory stays bounded by the model.

A host with `metrics = "http://..."` has its charts drawn from vLLM's /metrics counters instead
(exact, where the log lines are rounded summaries): a pane timer (paused while hidden) starts one
scrape at a time in a worker, through the host's connection (console/logs/metrics_service.py). Until
the first good scrape the charts stay on the log lines; an endpoint that stops answering keeps
its last figures, marked stale in the status line, which always names the charts' source."""

from __future__ import annotations

import asyncio
import posixpath
import time
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical
from textual.widgets import Input

from console.checkpoints.serve_guard import serving_runs
from console.errors import ConsoleError
from console.logs.follow import LogFollower
from console.logs.log_model import LogModel
from console.logs.metrics_service import MetricsError, scrape_host
from console.logs.vllm_metrics import MetricsHistory
from console.panes.timers import ShownTimers
from console.runs.service import list_runs
from console.ui.keymap import bindings
from console.ui.services import services
from console.widgets.host_strip import short_path
from console.widgets.log_charts import LogCharts
from console.widgets.log_view import LogView
from console.widgets.meters import count
from console.widgets.status_line import StatusLine

TAIL_LINES = 5000      # history loaded when a log is opened (charts get its stats lines)
REDRAW_S = 0.5      # the log text; the charts redraw at most once a second
FLOOD_REDRAW_S = 1.0
RETRY_S = 5.0
METRICS_POLL_S = 5.0   # a scrape costs ~1 ms of CPU here; vLLM's own log interval is 10 s
METRICS_TIMEOUT_S = 5.0


class LogsPane(ShownTimers, Vertical):
    """One followed log of the selected host, with its vLLM charts."""

    BINDINGS: ClassVar[list[BindingType]] = list(bindings("logs"))

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.model = LogModel()
        self.host: str | None = None
        self.paths: list[str] = []
        self.path_index = 0
        self.notice = ""
        self._drawn: tuple[object, ...] = ()
        self._drawn_at = 0.0
        self._drawn_total = 0
        self.metrics: MetricsHistory | None = None  # None: the host has no `metrics` URL
        self._scraping = False

    def compose(self) -> ComposeResult:
        yield StatusLine(id="logs-status")
        yield LogCharts(self.model, id="logs-charts")
        yield Input(placeholder="filter: lines containing… (Enter keeps, Esc clears)",
                    id="logs-filter")
        yield LogView(self.model, id="logs-view")

    def on_mount(self) -> None:
        self.query_one("#logs-filter", Input).display = False
        self.set_shown_interval(REDRAW_S, self.redraw)
        self.set_shown_interval(METRICS_POLL_S, self.poll_metrics)

    # -- what is followed -----------------------------------------------------------------------
    def show_host(self, host: str) -> None:
        if host == self.host:
            return
        self.host = host
        self.paths = list(services(self).config.hosts[host].logs)
        self.path_index = 0
        self._watch_metrics(services(self).config.hosts[host].metrics)
        self._open()
        self.add_server_logs(host)

    @work(group="server-logs", exclusive=True, exit_on_error=False)
    async def add_server_logs(self, host: str) -> None:
        """The logs of the host's running `serve` runs (their output.log is vLLM's log), after
        the configured ones; the first is opened when no log is configured."""
        try:
            records = await list_runs(await services(self).pool.ensure(host))
        except ConsoleError:
            return   # the host's state shows in the hosts list
        new = [posixpath.join(r.run_dir, "output.log") for r in serving_runs(records)
               if r.run_dir]
        new = [p for p in new if p not in self.paths]
        if host != self.host or not new:
            return
        had = self.path is not None
        self.paths += new
        if not had:
            self._open()
        else:
            self.redraw(force=True)

    def action_next_log(self) -> None:
        if self._no_log():
            return
        if len(self.paths) == 1:
            self.notify("only one log configured for this host", timeout=2)
            return
        self.path_index = (self.path_index + 1) % len(self.paths)
        self._open()

    def _no_log(self) -> bool:
        """Keys that act on a log say so when there is none (instead of doing nothing)."""
        if self.path is None:
            self.notify("no log open: add logs = [\"/path/vllm.log\"] to the host in the "
                        "config", severity="warning", timeout=3)
            return True
        return False

    @property
    def path(self) -> str | None:
        return self.paths[self.path_index] if self.paths else None

    def _open(self) -> None:
        self.model.clear()
        self.notice = ""
        view = self.query_one(LogView)
        view.set_following(True)
        if self.host is not None and self.path is not None:
            self.follow(self.host, self.path)
        else:
            self.workers.cancel_group(self, "logs")
        self.redraw(force=True)

    @work(exclusive=True, group="logs")
    async def follow(self, host: str, path: str) -> None:
        """Feed the model from the host's file until another log or host is chosen."""
        pool = services(self).pool
        while True:
            try:
                h = await pool.ensure(host)
                real = await h.resolve(path)
                # read as often as the text can redraw: reads in between only wake the app
                follower = LogFollower.on_host(h, real, tail_lines=TAIL_LINES, poll=REDRAW_S,
                                               on_notice=self._on_notice)
                async for batch in follower.batches():
                    self.model.add(batch)
                    if self.notice.startswith(("reconnecting", "error")):
                        self.notice = ""
                return
            except ConsoleError as e:
                self.notice = f"error: {e}"
                await asyncio.sleep(RETRY_S)

    def _on_notice(self, kind: str, detail: str) -> None:
        self.notice = f"{kind}: {detail}" if kind != "reconnected" else ""
        if kind == "truncated":   # a restarted server: its figures are a new series
            self.model.new_series()

    # -- vLLM /metrics ----------------------------------------------------------------------------
    def _watch_metrics(self, url: str | None) -> None:
        self.workers.cancel_group(self, "metrics")
        self._scraping = False
        self.metrics = MetricsHistory() if url else None
        self.query_one(LogCharts).metrics = self.metrics
        if self.is_on_screen:  # a hidden pane scrapes when shown (on_show), not before
            self.poll_metrics()

    def poll_metrics(self) -> None:
        """One scrape at a time: a slow endpoint delays the next one, never the UI."""
        if self.metrics is None or self.host is None or self._scraping:
            return
        url = services(self).config.hosts[self.host].metrics
        if url:
            self._scraping = True
            self.scrape_metrics(self.host, url, self.metrics)

    @work(group="metrics")
    async def scrape_metrics(self, host: str, url: str, history: MetricsHistory) -> None:
        try:
            h = await services(self).pool.ensure(host)
            snap = await scrape_host(h, url, METRICS_TIMEOUT_S)
            history.add(snap)
        except MetricsError as e:
            history.fail(e.why)
        except ConsoleError as e:  # the host itself (its state shows in the hosts list too)
            history.fail(str(e))
        finally:
            if history is self.metrics:
                self._scraping = False

    def _metrics_status(self) -> tuple[str, str, str]:
        """The charts' source for the status line, its style, and why /metrics fails."""
        m = self.metrics
        if m is None:
            return "  source: log", "label", ""
        why = f"  /metrics: {m.error}" if m.error else ""
        if not m.has_data:
            return ("  source: log (/metrics unreachable)", "alert", why) if m.error else \
                ("  source: log (/metrics: waiting)", "label", "")
        age = m.age(time.monotonic()) or 0.0
        if m.error or age > 2 * METRICS_POLL_S + METRICS_TIMEOUT_S:
            return f"  source: /metrics (stale {age:.0f} s)", "alert", why
        return "  source: /metrics", "low", ""

    # -- drawing --------------------------------------------------------------------------------
    def redraw(self, force: bool = False) -> None:
        if not (force or self.is_on_screen):
            return
        view = self.query_one(LogView)
        key = (self.model.version, view.following, self.notice, self.model.query,
               self.metrics.version if self.metrics else -1, self._metrics_status(),
               view.scroll_offset.x)
        if key == self._drawn and not force:
            return
        now = time.monotonic()
        # a flood (more new lines than the view shows) is redrawn once a second: nobody reads
        # a thousand lines a second, and each redraw would replace every visible row
        flood = self.model.total - self._drawn_total > view.size.height
        if flood and view.following and not force and now - self._drawn_at < FLOOD_REDRAW_S:
            return
        self._drawn, self._drawn_at, self._drawn_total = key, now, self.model.total
        view.sync(force)
        self.query_one(LogCharts).sync(force)
        self.query_one(StatusLine).show(self._status(view.following, view.scroll_offset.x))

    def _status(self, following: bool, pan: int = 0) -> list[tuple[str, str]]:
        if self.host is None:
            return [("Select a host.", "label")]
        parts: list[tuple[str, str]] = [(f"{self.host} ", "header")]
        source, style, why = self._metrics_status()
        if self.path is None:
            return parts + [(f"no logs configured: add logs = [\"/path/vllm.log\"] to "
                             f"[hosts.{self.host}] in the config", "label"),
                            *([(source, style), (why, "alert")] if self.metrics else [])]
        # the source fits in the path's room, so what follows still shows at 120 columns
        parts.append((short_path(self.path, max(24, 48 - len(source))), "label"))
        if len(self.paths) > 1:
            parts.append((f" ({self.path_index + 1}/{len(self.paths)}, l: next)", "label"))
        parts.append(("  ● following" if following else "  ‖ paused", "low" if following
                      else "mid"))
        m = self.model
        parts.append((f"  {count(m.total, 'line')}", "label"))
        parts.append((source, style))
        if m.errors:
            parts.append((f"  {count(m.errors, 'error')} (e/E)", "alert"))
        if m.query:
            parts.append((f"  filter “{m.query}”: {count(len(m.matches), 'line')}", "mid"))
        if pan:   # long lines panned with right: say so, and how back
            parts.append((f"  from column {pan + 1} (← →)", "mid"))
        if self.notice:
            parts.append((f"  {self.notice}", "alert" if self.notice.startswith(
                ("error", "reconnecting")) else "mid"))
        if why:
            parts.append((why, "alert"))
        return parts

    def on_show(self) -> None:
        self.poll_metrics()
        if self.host is not None:   # a server started since the host was chosen
            self.add_server_logs(self.host)
        self.redraw(force=True)

    def on_log_view_follow_changed(self, _event: LogView.FollowChanged) -> None:
        self.redraw(force=True)

    # -- keys -----------------------------------------------------------------------------------
    def action_toggle_follow(self) -> None:
        if self._no_log():
            return
        view = self.query_one(LogView)
        if not view.following and view.cursor < 0:
            view.cursor = self.model.visible() - 1
        view.set_following(not view.following)

    def action_error(self, direction: int) -> None:
        if self._no_log():
            return
        view = self.query_one(LogView)
        start = self.model.visible() if view.following else view.cursor
        row = self.model.find_error(start, -1 if view.following else direction)
        if row is None:
            self.notify("no more errors" if self.model.errors else "no errors in this log",
                        timeout=2)
            return
        view.go_to(row)

    def action_filter(self) -> None:
        if self._no_log():
            return
        box = self.query_one("#logs-filter", Input)
        box.display = True
        box.value = self.model.query
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.model.set_query(event.value)
        self.redraw(force=True)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._close_filter()

    def key_escape(self) -> None:
        box = self.query_one("#logs-filter", Input)
        if box.display or self.model.query:
            self.model.set_query("")
            self._close_filter()

    def _close_filter(self) -> None:
        box = self.query_one("#logs-filter", Input)
        box.display = False
        self.query_one(LogView).focus()
        self.redraw(force=True)
