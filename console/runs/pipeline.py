"""A pipeline run as the console follows and stops it (console/scheduler/pipeline.py starts
it, and holds PipelineRun, its parts' records under one id with its status).

Each part (store, producer, trainer) is a run of its own on its host (`ID.store`, ...), found
and stopped like any run, by PID and start time. The pipeline is running while its producer or
its trainer runs; once both have ended, that is its outcome, and its store, which would wait
for ever, is stopped (`settle`: what `follow` and the Runs pane do when they see it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from console.hosts.host import Host, HostPool
from console.runs.service import RunNotFound, find_run, stop_run
from console.runs.stream_figures import StreamFigures
from console.runs.watch import RunFeed
from console.scheduler.pipeline import PipelineRun, part_id
from console.scheduler.registry import Run
from console.scheduler.run_record import RunRecord
from console.scheduler.run_status import RunStatus
from console.settings.config import PARTS, Config, Profile


@dataclass(frozen=True)
class PipelineFeeds:
    """An opened pipeline: the feed of each part's node 0 (console/runs/watch.py)."""

    id: str
    feeds: Mapping[str, RunFeed]

    @property
    def main(self) -> RunFeed:
        """The feed the run detail is about: the trainer's (the producer's, the store's if
        the launch failed before)."""
        return next(self.feeds[p] for p in reversed(PARTS) if p in self.feeds)

    def run(self) -> PipelineRun:
        return PipelineRun(self.id, tuple(f.record for f in self.feeds.values()))

    def figures(self, part: str) -> StreamFigures:
        feed = self.feeds.get(part)
        return feed.progress.stream if feed is not None else StreamFigures()

    @property
    def version(self) -> tuple[int, ...]:
        """Moves whenever a part's feed did (what the screen redraws on)."""
        return tuple(f.progress.version for f in self.feeds.values())


def parts_text(pipe: PipelineRun, marks: Mapping[RunStatus, str]) -> str:
    """`store▶ producer▶ trainer✔`: each part that started, with its status's mark."""
    return " ".join(f"{name}{marks.get(st, '?')}" for name in PARTS
                    if (st := pipe.part_status(name)) is not None)


def pipeline_profile(config: Config, run_id: str) -> Profile | None:
    """The pipeline profile whose run id this is (`P-YYYYmmdd-HHMMSS-xxxx`, not a part's)."""
    for p in config.profiles.values():
        if p.pipeline is not None and run_id.startswith(p.name + "-") and \
                not run_id.endswith(tuple(f".{part}" for part in PARTS)):
            return p
    return None


def other_hosts(config: Config, host: str) -> list[str]:
    """The hosts of the pipelines that have a part on `host`, but for `host` itself."""
    return list(dict.fromkeys(h for p in config.profiles.values() if p.pipeline is not None
                              and host in p.hosts for h in p.hosts if h != host))


async def find_pipeline(config: Config, pid: str, pool: HostPool
                        ) -> list[tuple[Host, RunRecord]]:
    """Every record of every part of pipeline pid (RunNotFound when it has none)."""
    async def part(name: str) -> list[tuple[Host, RunRecord]]:
        try:
            return await find_run(config, part_id(pid, name), pool)
        except RunNotFound:   # a launch that failed before this part started
            return []
    found = [hr for hits in await asyncio.gather(*(part(p) for p in PARTS)) for hr in hits]
    if not found:
        raise RunNotFound(pid)
    return found


async def stop_any(config: Config, run_id: str, pool: HostPool, grace: float = 10.0) -> Run:
    """Stop a run, or every part of a pipeline: the trainer, then the producer, then the store
    (each by PID and start time, as any stop)."""
    if pipeline_profile(config, run_id) is None:
        return await stop_run(config, run_id, pool, grace)
    found = await find_pipeline(config, run_id, pool)
    done: list[RunRecord] = []
    for name in reversed(PARTS):
        ids = {r.id for _h, r in found if r.part == name}
        for rid in sorted(ids):
            done += (await stop_run(config, rid, pool, grace)).records
    return Run(run_id, done)


async def settle(config: Config, pipe: PipelineRun, pool: HostPool) -> PipelineRun:
    """Stop the store of a pipeline whose producer and trainer have ended (else as it is)."""
    lingering = pipe.lingering
    if not lingering:
        return pipe
    stopped = {r.id: r for r in (await stop_run(config, lingering[0].id, pool, 5.0)).records}
    return PipelineRun(pipe.id, tuple(stopped.get(r.id, r) if r.part == "store" else r
                                      for r in pipe.records))
