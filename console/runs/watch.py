"""Following one run on its host: its events and output caught up by byte offset, then live.

A `RunFeed` reads the run's `events.jsonl` (engine runs) and `output.log` with
console/logs/follow.py's LogFollower and feeds the lines to a RunProgress
(console/runs/progress.py). It remembers, per file, where the last whole line it handed over starts;
`follow()` can be cancelled at any time (the run detail closed, the console quitting) and called
again later: it goes on from there, so nothing is lost or counted twice. A new console starts a new
feed at byte 0 and catches up on the whole run. A dropped connection is the follower's business: it
reconnects with backoff and reads on from its offset.

`follow()` ends once the host's registry says the run is no longer running (nor pending) and both
files are read to their end; `ended()` is that question alone (the follow subcommand's too).
Provenance comes from the run record (what ran, with which pushed code) and, for `engine
train`, from the training run's own run.json (finetune source and sha256, data and vocab hashes):
read when following starts, looked for again with each registry check until it appears (the
engine writes it after loading its inputs), and read once more at the end.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import time
from collections.abc import Callable

from console.errors import TransportError
from console.hosts.host import Host
from console.logs.follow import LogFollower
from console.runs.progress import RunProgress
from console.runs.service import list_runs
from console.scheduler.run_record import RunRecord, TrainRun, VocabRemap
from console.scheduler.run_status import RunStatus

EVENTS, OUTPUT = "events.jsonl", "output.log"
STATUS_EVERY = 2.0
#: a run.json bigger than this is not a run record
MAX_JSON = 4 * 1024 * 1024


class RunFeed:
    """One run's live state on the console side (module docstring)."""

    def __init__(self, host: Host, record: RunRecord, *, poll: float = 0.5,
                 status_every: float = STATUS_EVERY) -> None:
        self.host = host
        self.record = record
        self.progress = RunProgress()
        self.progress.set_attempts(record.attempt_starts())
        self.poll = poll
        self.status_every = status_every
        self.train_run: TrainRun | None = None    # the engine's RUN_DIR/run.json
        self.notice = ""                           # "reconnecting: ..." while the link is down
        self.following = False
        self.finished = False                            # read to the end of a run that ended
        # per file: (offset of the last line handed over, or None for none yet)
        self._resume: dict[str, int | None] = {EVENTS: None, OUTPUT: None}
        self._asked = 0.0

    @property
    def run_id(self) -> str:
        return self.record.id

    @property
    def run_dir(self) -> str:
        return self.record.run_dir

    @property
    def status(self) -> RunStatus:
        return self.record.status

    def files(self) -> list[str]:
        return [EVENTS, OUTPUT] if self.record.engine else [OUTPUT]

    # -- following -----------------------------------------------------------------------------
    async def follow(self, on_change: Callable[[], None] | None = None) -> None:
        """Catch up from the remembered offsets, then follow until the run has ended."""
        if self.finished:
            return
        self.following = True
        try:
            await self.host.connect()
            await self.load_provenance()
            await asyncio.gather(*(self._pump(name, on_change) for name in self.files()))
            await self.load_provenance()
            self.finished = not self.status.active
        finally:
            self.following = False
            if on_change is not None:
                on_change()

    async def _pump(self, name: str, on_change: Callable[[], None] | None) -> None:
        path = posixpath.join(self.run_dir, name)
        resume = self._resume[name]

        def notice(kind: str, detail: str) -> None:
            self.notice = "" if kind == "reconnected" else f"{kind}: {detail}"
            self.progress.version += 1

        follower = LogFollower(self.host.transport, path,
                               start="begin" if resume is None else resume,
                               poll=self.poll, until=self.ended, on_notice=notice)
        skip = resume            # the line at the resume offset was handed over already
        async for batch in follower.batches():
            for line in batch:
                if skip is not None and line.offset == skip:
                    skip = None
                    continue
                skip = None
                if name == EVENTS:
                    self.progress.ingest_event_line(line.text)
                else:
                    self.progress.add_output(line.display())
                self._resume[name] = line.offset
            if on_change is not None:
                on_change()

    async def ended(self) -> bool:
        """Whether the run is over (the registry is asked at most every status_every s): a
        Slurm job still pending is not, its files are still to come."""
        if not self.status.active:
            return True
        if time.monotonic() - self._asked >= self.status_every:
            self._asked = time.monotonic()
            await self.refresh_record()
            if self.train_run is None:   # engine train writes it after its setup: show it then
                await self.load_provenance()
        return not self.status.active

    async def refresh_record(self) -> RunRecord:
        recs = await list_runs(self.host, self.run_id)
        mine = [r for r in recs if r.node_rank == self.record.node_rank] or recs
        if mine:
            self.record = mine[0]
            self.progress.set_attempts(self.record.attempt_starts())
            self.progress.version += 1
        return self.record

    # -- provenance ----------------------------------------------------------------------------
    def train_out(self) -> str | None:
        """The --out directory of an `engine train` run (its own run.json lives there)."""
        argv = self.record.argv
        if "train" not in argv:
            return None
        for i, a in enumerate(argv):
            if a == "--out" and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith("--out="):
                return a.split("=", 1)[1]
        return None

    async def load_provenance(self) -> None:
        """Read the training run's run.json (when there is one yet); never raises."""
        out = self.train_out()
        if out is None:
            return
        if not posixpath.isabs(out):
            out = posixpath.join(self.record.cwd or "/", out)
        try:
            data = await self.host.transport.read_range(posixpath.join(out, "run.json"), 0,
                                                        MAX_JSON)
            obj = json.loads(data.decode("utf-8", "replace")) if data else None
        except (TransportError, ValueError):
            return
        run = TrainRun.parse(obj)
        if run is not None:
            self.train_run = run
            self.progress.version += 1

    def provenance(self) -> list[tuple[str, str]]:
        """(label, value) rows: what ran, the code it ran, and what it trained from."""
        # few rows: the run detail box has ~10 rows of ~45 columns at 120x40; a value is
        # "PATH (what, sha256 PREFIX)" so the screen can shorten the path and keep the hash
        rows: list[tuple[str, str]] = [("run", f"{self.run_id} on {self.record.host}")]
        push = self.record.push
        tr = self.train_run
        code = [f"manifest {push.manifest[:12]}"] if push.manifest else []
        if tr and tr.engine:
            code.append(f"engine {tr.engine}")
        if code:
            rows.append(("code", " · ".join(code)))
        by_commit: dict[str, list[str]] = {}
        for tree, commit in push.git.items():
            by_commit.setdefault(commit, []).append(tree)
        for commit, trees in by_commit.items():
            dirty = " (local changes)" if commit.endswith("-dirty") else ""
            rows.append(("git", f"{commit.removesuffix('-dirty')[:12]}{dirty} "
                                f"({', '.join(trees)})"))
        if tr:
            ft = tr.finetune
            if ft is not None:
                sha = f", sha256 {ft.sha256[:12]}" if ft.sha256 else ""
                rows.append(("finetune", f"{ft.path} ({ft.format}{sha})"))
                if ft.remap is not None:
                    rows.append(("remap", _remap_text(ft.remap)))
            else:
                rows.append(("finetune", "— (from scratch)"))
            if tr.target:
                rows.append(("target", tr.target))
            if tr.data:
                rows.append(("data", f"{tr.data} (sha256 {(tr.data_sha256 or '?')[:12]})"))
            vocab = tr.vocab or ("rebuilt from data" if tr.rebuild_vocab
                                 else "the checkpoint's / built from data")
            rows.append(("vocab", f"{vocab} (sha256 {(tr.vocab_sha256 or '?')[:12]})"))
        if self.record.argv:  # last: the longest, and what wraps
            rows.append(("command", " ".join(self.record.argv)))
        return rows


def _remap_text(remap: VocabRemap) -> str:
    """`kept 160, new 32, dropped 0 (160 -> 192 ids)`, or every number it has."""
    if remap.kept is not None and remap.new is not None and remap.dropped is not None \
            and remap.old_size is not None and remap.new_size is not None:
        return (f"kept {remap.kept}, new {remap.new}, dropped {remap.dropped} "
                f"({remap.old_size} -> {remap.new_size} ids)")
    return ", ".join(f"{k} {v}" for k, v in remap.numbers)


class RunFeeds:
    """The feeds of this console session, one per (host, run id), so reopening a run goes on
    where its feed stopped instead of starting over."""

    def __init__(self) -> None:
        self._feeds: dict[tuple[str, str], RunFeed] = {}

    def get(self, host: Host, record: RunRecord) -> RunFeed:
        key = (host.name, record.id)
        feed = self._feeds.get(key)
        if feed is None:
            feed = self._feeds[key] = RunFeed(host, record)
        elif feed.status.active:
            feed.record = record    # records only move on: pending, running, then how it ended
        elif (record.start or 0) > (feed.record.start or 0):
            # started again (resumed, console/runs/service.py resume_run): the same files go
            # on, so the feed follows on from its offsets; the last attempt's outcome is over
            feed.record, feed.finished = record, False
            feed.progress.set_attempts(record.attempt_starts())
            feed.progress.error, feed.progress.result = None, None
            feed.progress.version += 1
        return feed

    def find(self, host: str, run_id: str) -> RunFeed | None:
        return self._feeds.get((host, run_id))
