"""What the Runs pane shows and may do, decided apart from how it is drawn.

`RunsModel` keeps each host's run records as last listed, the feeds that follow runs in the
background (console/runs/watch.py), which finished engine runs were caught up on once this
session (so a new console shows their PROGRESS too), and the busy lock: one push, launch, stop
or prune at a time. It does the registry reads; starting a background follow is the caller's
(`spawn`: the pane hands it to a Textual worker), so the model holds no widget and no timer.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from console.errors import CommandFailed, ConsoleError, TransportError, describe_error
from console.hosts.host import Host
from console.runs.service import list_runs
from console.runs.watch import RunFeed, RunFeeds
from console.scheduler.pipeline import PipelineRun, pipelines
from console.scheduler.registry import newest_first
from console.scheduler.run_record import RunRecord
from console.scheduler.run_status import RunStatus

#: finished engine runs read once per session (their PROGRESS after a restart)
CATCH_UP = 20

#: how a background follow is started: (the coroutine, a group name unique to the run)
Spawn = Callable[[Coroutine[Any, Any, None], str], None]


class RunsModel:
    """Records, feeds, catch-up and the busy lock of the Runs pane (module docstring)."""

    def __init__(self, spawn: Spawn) -> None:
        self.spawn = spawn
        self.records: dict[str, list[RunRecord]] = {}
        self.feeds = RunFeeds()
        self.busy: str | None = None            # what is being done (push, launch, ...)
        # per host: why its registry could not be read (the last read failed), and the short
        # form the counts show instead of "0 runs" (`cannot reach gpu1`)
        self.list_error: dict[str, str] = {}
        self.list_failure: dict[str, str] = {}
        self.listed = 0                          # how many registry reads have completed
        self.listing = False
        self._caught_up: set[tuple[str, str]] = set()   # finished runs read once already

    # -- the busy lock -------------------------------------------------------------------------
    def begin(self, what: str) -> bool:
        """Take the lock for `what`; False while something else holds it (see `busy`)."""
        if self.busy is not None:
            return False
        self.busy = what
        return True

    def end(self) -> None:
        self.busy = None

    # -- the registry --------------------------------------------------------------------------
    async def load(self, h: Host, others: Sequence[Host] = ()) -> bool:
        """Read h's registry and follow what should be followed; False (and `list_error`) when
        the read failed. others: the hosts of h's pipelines' other parts, read too (one that
        cannot be read keeps what was last read of it)."""
        self.listing = True
        try:
            recs = await list_runs(h)
            for o in others:
                await self.reload(o)
        except ConsoleError as e:
            self.failed(h.name, e)
            return False
        finally:
            self.listing = False
        self.list_error.pop(h.name, None)
        self.list_failure.pop(h.name, None)
        self.records[h.name] = recs
        self.listed += 1
        self.start_feeds(h, recs)
        return True

    def failed(self, host: str, e: ConsoleError) -> None:
        """A registry read (or the connection before it) failed: what the counts say instead
        of the runs (a host never listed has no runs to show, not 0)."""
        self.list_error[host] = f"cannot read {host}'s run registry: {describe_error(e)}"
        reach = isinstance(e, TransportError) and not isinstance(e, CommandFailed)
        self.list_failure[host] = f"cannot reach {host}" if reach \
            else f"cannot read {host}'s runs"

    def listed_on(self, host: str) -> bool:
        """Whether a read of host's registry has completed (else its runs are not known yet)."""
        return host in self.records

    async def reload(self, h: Host) -> None:
        """Read the registry again after an action (a failed read keeps what was shown)."""
        try:
            self.records[h.name] = await list_runs(h)
        except ConsoleError:
            return
        self.start_feeds(h, self.records[h.name])

    def shown(self, host: str) -> list[RunRecord]:
        """The host's records in the order they are shown: newest first."""
        return newest_first(self.records.get(host, []))

    def find(self, host: str, run_id: str | None) -> RunRecord | None:
        return next((r for r in self.records.get(host, []) if r.id == run_id), None)

    # -- pipelines -----------------------------------------------------------------------------
    def _pipelines(self) -> dict[str, PipelineRun]:
        return pipelines([r for recs in self.records.values() for r in recs])

    def rows(self, host: str) -> list[RunRecord | PipelineRun]:
        """What the runs table shows for host, newest first: a pipeline with a part there is
        one row (with its parts on every host read), any other run one row per record."""
        pipes = self._pipelines()
        out: list[RunRecord | PipelineRun] = []
        seen: set[str] = set()
        for r in self.shown(host):
            if r.pipeline in pipes:
                if r.pipeline not in seen:
                    seen.add(r.pipeline)
                    out.append(pipes[r.pipeline])
            else:
                out.append(r)
        return out

    def find_pipeline(self, pipeline_id: str | None) -> PipelineRun | None:
        return self._pipelines().get(pipeline_id or "")

    def lingering(self, host: str) -> list[PipelineRun]:
        """host's pipelines whose producer and trainer have ended while their store runs."""
        return [p for p in self.rows(host) if isinstance(p, PipelineRun) and p.lingering]

    def trainer_feed(self, pipe: PipelineRun) -> RunFeed | None:
        """The feed of the pipeline's trainer (node 0), once it is followed."""
        lead = pipe.part("trainer")
        where = self.listed_by(lead[0]) if lead else None
        return self.feeds.find(where, lead[0].id) if where else None

    def listed_by(self, rec: RunRecord) -> str | None:
        """The configured host whose registry holds rec (what the record says of its host is
        the host's word, not the console's)."""
        return next((h for h, recs in self.records.items() if rec in recs), None)

    def ended(self, host: str) -> list[str]:
        """The ids `prune` would forget (the host decides again)."""
        return [r.id for r in self.records.get(host, []) if r.status.ended]

    def counts(self, host: str) -> tuple[int, int]:
        """(running, queued) runs on host (a pipeline one run); queued: Slurm jobs waiting
        for nodes."""
        rows = self.rows(host)
        return (sum(r.status == RunStatus.RUNNING for r in rows),
                sum(r.status == RunStatus.PENDING for r in rows))

    def newest_of(self, host: str, profile: str | None) -> RunRecord | None:
        mine = [r for r in self.records.get(host, []) if r.profile == profile]
        return newest_first(mine)[0] if mine else None

    # -- feeds ---------------------------------------------------------------------------------
    def start_feeds(self, h: Host, recs: list[RunRecord]) -> None:
        """Follow the running runs; read the newest finished engine runs once, so a new
        console shows their PROGRESS too (150/150, not -)."""
        finished = 0
        for rec in newest_first(recs):
            feed = self.feeds.get(h, rec)
            if rec.status == RunStatus.RUNNING:
                if not feed.following:
                    self.start_feed(feed)
            elif rec.engine and rec.status != RunStatus.CORRUPT and finished < CATCH_UP:
                finished += 1
                if (h.name, rec.id) not in self._caught_up:
                    self._caught_up.add((h.name, rec.id))
                    self.start_feed(feed)

    def feed(self, h: Host, rec: RunRecord) -> RunFeed:
        """The run's feed, followed from now on (opening a run)."""
        feed = self.feeds.get(h, rec)
        self.start_feed(feed)
        return feed

    def start_feed(self, feed: RunFeed) -> None:
        """Follow a run in the background (idempotent while it follows)."""
        if feed.following or feed.finished:
            return
        feed.following = True   # set now: the follow starts on the next loop turn
        self.spawn(self._follow(feed), f"feed-{feed.host.name}-{feed.run_id}")

    @staticmethod
    async def _follow(feed: RunFeed) -> None:
        try:
            await feed.follow()
        except ConsoleError as e:
            feed.notice = f"stopped following: {describe_error(e)}"
            feed.progress.version += 1
        finally:
            feed.following = False
