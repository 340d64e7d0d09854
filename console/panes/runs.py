"""The runs pane: the selected host's profiles and runs; push, launch, stop, open.

    p      push the engine and the host's sync sets (only what changed; files and bytes shown)
    t      launch the selected profile: push what changed, then start it detached; a profile
           that is already running asks before a second copy starts (launch --force)
    x      stop the selected run (asks first): SIGTERM to its process group, SIGKILL later;
           a pipeline's row: every part (console/runs/pipeline.py)
    P      forget the host's ended runs (asks first): their records and logs are deleted; files
           they wrote (out/), running and queued runs stay; nothing is signalled
    enter  open the run: progress, live plots, log lines, provenance (screens/run_detail.py);
           on a profile, its newest run; a pipeline's row: its trainer with the stream's charts
    tab    the other table (profiles / runs): focus stays in the pane
    r      re-read the host's run registry (it is re-read every few seconds anyway)

No I/O here and no decisions: a RunsModel (console/runs/model.py) holds the records, the feeds
that follow runs in the background, the catch-up of finished runs and the busy lock; workers call
the services (console/runs/service.py, console/hosts/push.py) and the pane redraws from what the
model holds, on a timer. The feeds outlive the pane's redraws, so reopening a run goes on from
where its feed was.

With the embedded default (no config file) the pane also shows the demo workspace's first build
(console/demo/build.py posts each step as a DemoChanged message), with a progress bar, and is the
tab the console opens on.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.widgets import DataTable, Label, Static

from console.demo.build import DemoState, DemoStatus, build_demo
from console.dialogs.confirm import ConfirmScreen
from console.errors import CommandFailed, ConsoleError, TransportError, describe_error
from console.hosts.host import Host
from console.hosts.push import PushReport, host_trees, push
from console.panes.timers import ShownTimers
from console.runs.model import RunsModel
from console.runs.pipeline import (
    PipelineFeeds,
    other_hosts,
    parts_text,
    settle,
    stop_any,
)
from console.runs.service import launch, prune_runs, resume_run
from console.scheduler.launch import LaunchHooks, NotStarted
from console.scheduler.pipeline import PipelineRun
from console.scheduler.run_record import RunRecord
from console.scheduler.run_status import RunStatus
from console.settings.config import LOCAL, PARTS, Config
from console.ui.host_text import markup, plain
from console.ui.keymap import bindings
from console.ui.messages import DemoChanged, OpenRun
from console.ui.services import services
from console.widgets.meters import count, fmt_bytes
from console.widgets.progress import ProgressBar
from console.widgets.run_tables import (
    STATUS_MARK,
    ProfileTable,
    RunTable,
    pipeline_row,
    profile_row,
    run_row,
    stop_outcome,
)

LIST_EVERY_S = 5.0
STOP_GRACE_S = 10.0


def push_summary(report: PushReport) -> str:
    """`pushed 3 of 41 files, 12.0K (engine 3/38, hostside 0/3) · code 1a2b3c4d`."""
    files = sum(t.files for t in report.trees)
    trees = ", ".join(f"{t.name} {t.sent}/{t.files}" for t in report.trees)
    verb = "pushed" if report.files_sent else "up to date:"
    sent = f"{report.files_sent} of {files} files, {fmt_bytes(report.bytes_sent)}" \
        if report.files_sent else f"0 of {files} files sent"
    return f"{verb} {sent} to {report.host} ({trees}) · code {report.manifest[:8]}"


class RunsPane(ShownTimers, Vertical):
    """Profiles and runs of the selected host (module docstring)."""

    BINDINGS: ClassVar[list[BindingType]] = list(bindings("runs"))

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.host: str | None = None
        self.model = RunsModel(spawn=self._spawn)
        self.demo_state: DemoState | None = None   # None until the demo's build first posts
        self._drawn: tuple[object, ...] = ()
        self._hint = False     # the activity line holds the "no profile runs here" hint
        self._said = False     # the activity line holds something (an action's outcome)
        # the host whose action failed on the activity line because it could not be reached:
        # its next good registry read says it is back (the failure stayed for minutes)
        self._unreached: str | None = None

    def _spawn(self, coro: Coroutine[Any, Any, None], group: str) -> None:
        """How the model follows a run in the background: a worker of this pane."""
        self.run_worker(coro, group=group, exclusive=True, exit_on_error=False)

    # -- layout --------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static("", id="runs-status")
        with Horizontal(id="runs-activity-row"):
            yield Static("", id="runs-activity")
            yield ProgressBar(id="runs-bar", show_eta=False)
        yield Label("Profiles", classes="section")
        yield ProfileTable(id="profiles-table")
        yield Label("Runs", classes="section")
        yield RunTable(id="runs-table")

    def on_mount(self) -> None:
        self.query_one("#runs-bar").display = False
        self.set_shown_interval(1.0, self.refresh_view)
        self.set_shown_interval(LIST_EVERY_S, self._poll)
        if self.config.demo is not None:
            # the embedded demo opens on this pane: it is where a new user starts
            self.call_after_refresh(lambda: self.screen.run_action("show_pane('runs')"))

    @property
    def config(self) -> Config:
        return services(self).config

    def _host(self, name: str) -> Host:
        return services(self).pool[name]

    def activity(self, text: str | Content | Text, error: bool = False) -> None:
        """The activity line: a str is shown as written (it quotes run ids, paths, errors);
        Content made with host_text.markup where a part is bold, Text as it is."""
        w = self.query_one("#runs-activity", Static)
        w.update(text if isinstance(text, (Content, Text)) else plain(text))
        w.set_class(error, "-error")
        self._said = bool(text)
        self._hint = False
        self._unreached = None

    def failure(self, what: str, host: str | None, e: ConsoleError) -> None:
        """An action failed: the reason on the activity line, until a newer line; one for a
        host that could not be reached goes once a registry read of that host succeeds."""
        self.activity(f"{what} failed: {describe_error(e)}", error=True)
        if isinstance(e, TransportError) and not isinstance(e, CommandFailed):
            self._unreached = e.host if host is None else host

    def bar(self, done: float | None, total: float | None) -> None:
        bar = self.query_one("#runs-bar", ProgressBar)
        bar.display = done is not None
        if done is not None:
            bar.update(total=total, progress=done)

    # -- host selection and refresh ------------------------------------------------------------
    def show_host(self, host: str) -> None:
        if host != self.host and self.model.busy is None and \
                self.demo_state != DemoState.BUILDING:
            self.activity("")   # what it said was about the previous host
        self.host = host
        self.refresh_view(force=True)
        if self.config.demo is not None and host == LOCAL and self.demo_state is None:
            self.demo_state = DemoState.BUILDING
            self.build_demo(host, self.config.demo)
        if self.is_on_screen:
            self.load_runs(host)

    def on_show(self) -> None:
        if self.host is not None:
            self.load_runs(self.host)
        self.refresh_view(force=True)

    def _poll(self) -> None:
        # a slow host: let the read in flight finish rather than restart it every tick
        if self.host is not None and self.is_on_screen and not self.model.listing:
            self.load_runs(self.host)

    def action_refresh(self) -> None:
        if self.host is not None:
            self.load_runs(self.host)

    @work(exclusive=True, group="runs-list", exit_on_error=False)
    async def load_runs(self, host: str) -> None:
        self.model.listing = True   # at once: the poll must not start a second read
        pool = services(self).pool
        try:
            others = []
            for name in other_hosts(self.config, host):   # a pipeline's parts elsewhere
                try:
                    others.append(await pool.ensure(name))
                except ConsoleError:
                    pass   # its parts show as last read
            read = await self.model.load(await pool.ensure(host), others)
            for pipe in self.model.lingering(host):
                # its producer and trainer are done: its store would wait for ever
                try:
                    await settle(self.config, pipe, pool)
                except ConsoleError:
                    continue   # tried again at the next read
                read = await self.model.load(await pool.ensure(host), others)
        except ConsoleError as e:
            self.model.failed(host, e)
            read = False
        finally:
            self.model.listing = False   # also when a newer read cancelled this one
        if read and self._unreached == host:
            self.activity(f"{host} is reachable again")
        self.refresh_view(force=True)

    # -- drawing -------------------------------------------------------------------------------
    def profiles(self) -> list[str]:
        """Profiles that run on the selected host (first), in config order."""
        return [name for name, p in self.config.profiles.items() if self.host in p.hosts]

    def refresh_view(self, force: bool = False) -> None:
        if self.host is None or not (force or self.is_on_screen):
            return
        host = self.host
        now: float = services(self).clock()
        model = self.model
        recs = model.shown(host)
        rows = model.rows(host)
        feeds = [model.trainer_feed(r) if isinstance(r, PipelineRun) else
                 model.feeds.find(host, r.id) for r in rows]
        key = (host, int(now), tuple((r.id, r.status, r.end, r.reason) for r in recs),
               tuple(parts_text(r, STATUS_MARK) for r in rows if isinstance(r, PipelineRun)),
               tuple(f.progress.version if f else -1 for f in feeds),
               model.list_error.get(host), model.listed_on(host), self.demo_state,
               len(self.config.profiles))
        if key == self._drawn and not force:
            return
        self._drawn = key
        profiles = self.profiles()
        self.query_one(ProfileTable).show(
            [profile_row(self.config.profiles[n]) for n in profiles])
        self.query_one(RunTable).show(
            [r.id for r in rows],
            [pipeline_row(r, f.progress if f else None, now) if isinstance(r, PipelineRun) else
             run_row(r, f.progress if f else None, now) for r, f in zip(rows, feeds, strict=True)])
        running, queued = model.counts(host)
        where = self.config.hosts[host].ssh or "this machine"
        failure = model.list_failure.get(host)
        if not model.listed_on(host):   # no runs known yet: not "0 runs"
            runs = f"runs: {failure}" if failure else "listing runs…"
        else:
            runs = count(len(rows), "run") + (f", {running} running" if running else "") + \
                (f", {queued} queued" if queued else "") + \
                (f" (as last read: {failure})" if failure else "")
        status = markup("[b]$host[/b] ($where) · $counts", host=host, where=where,
                        counts=f"{count(len(profiles), 'profile')} · {runs}")
        selected = self.query_one(ProfileTable).selected
        if selected:   # what t starts: the cursor in the profiles table, wherever focus is
            status += markup(" · [b]t[/b] launches [b]$name[/b]", name=selected)
        if host in model.list_error:
            status += markup("\n[$error]$error[/]", error=model.list_error[host])
        self.query_one("#runs-status", Static).update(status)
        # while the demo builds, and after it failed, the activity line says so instead
        # ... and never over what an action said (a push's outcome on a host without profiles)
        if model.busy is None and self.demo_state not in (DemoState.BUILDING, DemoState.FAILED) \
                and not profiles and (self._hint or not self._said):
            hidden = ""
            if self.config.path is not None and self.config.demo is None:
                hidden = " (demo profiles hidden: your config defines hosts; demo = true keeps"\
                          " them)"
            self.activity(f"No profile runs on this host{hidden}: add [profiles.NAME] with "
                          f"host = \"{host}\" to the config.")
            self._hint = True
        elif self._hint and profiles:
            self.activity("")

    # -- actions -------------------------------------------------------------------------------
    def _selected_run(self) -> RunRecord | None:
        return self.model.find(self.host or "", self.query_one(RunTable).selected)

    def _start(self, what: str) -> bool:
        if not self.model.begin(what):
            self.notify(f"Busy: {self.model.busy}", severity="warning", markup=False)
            return False
        return True

    def action_push(self) -> None:
        if self.host is not None and self._start("push"):
            self.do_push(self.host)

    @work(group="runs-action", exit_on_error=False)
    async def do_push(self, host: str) -> None:
        try:
            self.activity(f"pushing to {host}: comparing manifests…")
            h = await services(self).pool.ensure(host)
            report = await self._push(h, None)
            self.activity(push_summary(report))
            self.notify(push_summary(report))   # a toast too: a push changes nothing on screen
        except ConsoleError as e:
            self.failure("push", host, e)
        finally:
            self.model.end()
            self.bar(None, None)

    async def _push(self, h: Host, syncs: list[str] | None) -> PushReport:
        def progress(done: int, total: int, sent: int) -> None:
            self.activity(f"pushing to {h.name}: {done}/{total} files, {fmt_bytes(sent)}")
            self.bar(done, total)

        trees = await host_trees(h, self.config, syncs)
        return await push(h, trees, on_progress=progress)   # it sets h.engine_pushed

    def action_launch(self) -> None:
        name = self.query_one(ProfileTable).selected
        if name is None:
            self.notify("No profile to launch on this host", severity="warning")
            return
        if self.config.demo is not None and self.demo_state == DemoState.BUILDING:
            self.notify("The demo workspace is still being built; launch when it is ready",
                        severity="warning")
            return
        if self._start(f"launch {name}"):
            self.do_launch(name)

    @work(group="runs-action", exit_on_error=False)
    async def do_launch(self, name: str) -> None:
        profile = self.config.profile(name)
        pool = services(self).pool

        async def confirm(busy: list[RunRecord]) -> bool:
            ids = ", ".join(sorted({r.id for r in busy}))
            again: bool = await self.app.push_screen_wait(ConfirmScreen(markup(
                "Profile [b]$name[/b] is already running ($ids).\n\nStart a second copy?",
                name=name, ids=ids), yes="Start another"))
            return again

        def step(text: str) -> None:
            self.bar(None, None)
            self.activity(text)

        def progress(host: str, done: int, total: int, sent: int) -> None:
            self.activity(f"pushing to {host}: {done}/{total} files, {fmt_bytes(sent)}")
            self.bar(done, total)

        try:
            for h in profile.hosts:
                await pool.ensure(h)  # the hosts list shows each connecting
            # one call: it asks before a second copy, pushes (only what changed), then starts
            run = await launch(self.config, name, pool,
                               hooks=LaunchHooks(confirm=confirm, step=step, progress=progress))
        except NotStarted as e:
            self.activity(str(e))
            return
        except ConsoleError as e:
            self.failure(f"launch of {name}", None, e)
            return
        finally:
            self.model.end()
            self.bar(None, None)
        self.activity(markup("started [b]$id[/b] · $pushes", id=run.id,
                             pushes=" · ".join(map(push_summary, run.pushes))))
        if self.host is not None:
            await self._reload(self.host)
            # the new run is selected below; focus and the profile cursor stay where the user
            # put them, so t again means the same profile and Up moves among profiles
            self.query_one(RunTable).select(run.id)

    async def _reload(self, host: str) -> None:
        try:
            h = await services(self).pool.ensure(host)
        except ConsoleError:
            return
        await self.model.reload(h)
        self.refresh_view(force=True)

    def _selected_pipeline(self) -> PipelineRun | None:
        return self.model.find_pipeline(self.query_one(RunTable).selected)

    def action_stop(self) -> None:
        pipe = self._selected_pipeline()
        if pipe is not None:
            if not pipe.status.active and not pipe.lingering:
                said = f"{pipe.id} has already ended ({pipe.status}): nothing to stop"
                self.activity(said)
                self.notify(said, severity="warning")
            elif self._start(f"stop {pipe.id}"):
                self.do_stop(pipe.id)
            return
        rec = self._selected_run()
        if rec is None:
            self.notify("No run selected", severity="warning")
            return
        if not rec.status.active:  # active: running, or a queued Slurm job (scancel)
            # on the activity line too: a toast is easy to miss, and x must never seem to do
            # nothing
            said = f"{rec.id} has already ended ({rec.status}): nothing to stop"
            self.activity(said)
            self.notify(said, severity="warning")
            return
        if self._start(f"stop {rec.id}"):
            self.do_stop(rec.id)

    @work(group="runs-action", exit_on_error=False)
    async def do_stop(self, run_id: str) -> None:
        try:
            rec = self._selected_run()
            how = (f"scancel --signal=TERM, scancel after {STOP_GRACE_S:.0f} s"
                   if rec is not None and rec.id == run_id and rec.job_id else
                   f"SIGTERM to its process group, SIGKILL after {STOP_GRACE_S:.0f} s (longer "
                   f"while it swaps an eval server's drafter back)")
            ok = await self.app.push_screen_wait(ConfirmScreen(markup(
                "Stop [b]$run[/b]?\n\n$how.", run=run_id, how=how), yes="Stop it"))
            if not ok:
                return
            self.activity(f"stopping {run_id}…")
            # through the pool: the hosts list shows the host connecting, or failing
            run = await stop_any(self.config, run_id, services(self).pool, grace=STOP_GRACE_S)
            refused = next((r.refused for r in run.records if r.refused), "")
            warning = next((r.stop_warning for r in run.records if r.stop_warning), "")
            self.activity(stop_outcome(run_id, run.status, refused, warning),
                          error=bool(refused or warning))
        except ConsoleError as e:
            self.failure("stop", None, e)
        finally:
            self.model.end()
        if self.host is not None:
            await self._reload(self.host)

    def action_resume(self) -> None:
        pipe = self._selected_pipeline()
        if pipe is not None:   # its producer's and trainer's parts start together, afresh
            self.activity(f"{pipe.id} is a pipeline: it is not resumed; launch its profile "
                          "again (t)")
            return
        rec = self._selected_run()
        if rec is None:
            self.notify("No run selected", severity="warning")
            return
        if self._start(f"resume {rec.id}"):
            self.do_resume(rec.id, rec.host)

    @work(group="runs-action", exit_on_error=False)
    async def do_resume(self, run_id: str, host: str) -> None:
        """R: the run again in its run directory with --resume (refusals said on the activity
        line: a run still running or that succeeded, a command without --resume)."""
        try:
            self.activity(f"resuming {run_id}…")
            run = await resume_run(self.config, run_id, services(self).pool, host=host)
        except ConsoleError as e:
            self.activity(f"resume of {run_id} refused: {describe_error(e)}", error=True)
            return
        finally:
            self.model.end()
        self.activity(markup("resumed [b]$id[/b] in its run directory · $pushes", id=run.id,
                             pushes=" · ".join(map(push_summary, run.pushes))))
        if self.host is not None:
            await self._reload(self.host)

    def action_prune(self) -> None:
        host = self.host
        if host is None:
            return
        ended = self.model.ended(host)
        if not ended:
            self.activity(f"No ended runs to forget on {host}")
            return
        if self._start(f"prune {host}"):
            self.do_prune(host, len(ended))

    @work(group="runs-action", exit_on_error=False)
    async def do_prune(self, host: str, n: int) -> None:
        try:
            ok = await self.app.push_screen_wait(ConfirmScreen(markup(
                "Forget the $n on [b]$host[/b]?\n\nTheir records and logs are deleted; files "
                "they wrote (out/) stay. Running runs stay; nothing is signalled.",
                n=count(n, 'ended run'), host=host), yes="Forget them"))
            if not ok:
                return
            report = await prune_runs(await services(self).pool.ensure(host))
            kept = f" · kept {len(report.kept)} (running or unreadable)" if report.kept else ""
            left = f" · {len(report.left)} folders kept for files the console did not " \
                "write" if report.left else ""
            self.activity(f"forgot {count(len(report.removed), 'ended run')} on {host}"
                          + kept + left)
        except ConsoleError as e:
            self.failure("prune", host, e)
        finally:
            self.model.end()
        await self._reload(host)

    def action_open(self) -> None:
        pipe = self._selected_pipeline()
        if pipe is not None:
            feeds = {}
            for part in PARTS:
                lead = pipe.part(part)
                where = self.model.listed_by(lead[0]) if lead else None
                if lead and where and lead[0].status != RunStatus.CORRUPT:
                    feeds[part] = self.model.feed(self._host(where), lead[0])
            if feeds:
                opened = PipelineFeeds(pipe.id, feeds)
                self.post_message(OpenRun(opened.main, opened))
            return
        rec = self._selected_run()
        if rec is None or self.host is None:
            self.notify("No run selected", severity="warning")
            return
        if rec.status == RunStatus.CORRUPT:  # nothing in its record can be followed
            self.notify(f"{rec.id}: corrupt record ({rec.error})", severity="warning",
                        markup=False)
            return
        feed = self.model.feed(self._host(self.host), rec)
        self.post_message(OpenRun(feed))  # the main screen shows it (screens/run_detail.py)

    def action_next_table(self) -> None:
        """tab: the profiles table, the runs table, and back; focus stays in the pane."""
        profiles, runs = self.query_one(ProfileTable), self.query_one(RunTable)
        (profiles if self.screen.focused is runs else runs).focus()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if isinstance(event.data_table, ProfileTable):
            self.refresh_view(force=True)   # the status says which profile t launches

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if isinstance(event.data_table, RunTable):
            event.stop()
            self.action_open()
        elif isinstance(event.data_table, ProfileTable):
            # enter on a profile: its newest run (what a user who just pressed t wants)
            event.stop()
            name = event.data_table.selected
            newest = self.model.newest_of(self.host or "", name)
            if newest is None:
                self.notify(f"{name} has no run yet: press t to launch it", severity="warning")
                return
            self.query_one(RunTable).select(newest.pipeline or newest.id)
            self.action_open()

    # -- the embedded demo ---------------------------------------------------------------------
    @work(group="demo", exit_on_error=False)
    async def build_demo(self, host: str, workspace: str) -> None:
        try:
            h = await services(self).pool.ensure(host)
        except ConsoleError as e:
            self.post_message(DemoChanged(DemoStatus(
                DemoState.FAILED, "The demo workspace could not be built: ",
                detail=describe_error(e), error=True)))
            return
        def post(status: DemoStatus) -> None:
            self.post_message(DemoChanged(status))

        await build_demo(h, workspace, self.config, post)

    def on_demo_changed(self, message: DemoChanged) -> None:
        s = message.status
        self.demo_state = s.state
        if s.text or s.detail:   # our words may mark keys up; the engine's are plain text
            self.activity(Text.from_markup(s.text) + Text(s.detail), error=s.error)
        self.bar(s.done, s.total)
        if s.toast:
            self.notify(s.toast)
        if s.state != DemoState.BUILDING:
            self.refresh_view(force=True)
