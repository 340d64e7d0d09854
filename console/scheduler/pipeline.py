"""A pipeline profile's launch: the stream's store, then its producer, then its trainer, each a
detached run of console/scheduler/ssh.py under one pipeline run id; a trainer on a Slurm
host is a batch job instead (console/scheduler/slurm.py, `nodes` and [P.trainer.slurm]).

    store     PYTHON -m engine stream-master --host ADDR --address-file RUN_DIR/store.addr
    producer  the [P.producer] run string, `{stream}` the store's address
    trainer   the [P.trainer] run string, the same; under torchrun as any profile's

The pipeline's id is a run id (`P-YYYYmmdd-HHMMSS-xxxx`); each part is a run of its own, with
the id `ID.store`, `ID.producer`, `ID.trainer` and `pipeline` and `part` in its record, so the
registry, `stop` (by PID and start time, or scancel), and `follow` by byte offset work on each
as on any run.
The store listens on ADDR, the address the other hosts reach its host at ([P.store] address,
else chosen as torchrun's rendezvous address is); the launch reads the address the master
announced back from its file before it starts the others. `{stream_run}` is the stream run's
name (the pipeline's id). A part that cannot start takes down the parts started before it.

`PipelineRun` is a pipeline as its parts' records say: running while its producer or its
trainer runs, then their outcome; its store, which would wait for ever, is `lingering` once
both have ended (the launch stops an earlier one's, console/runs/pipeline.py `settle` too).
"""

from __future__ import annotations

import asyncio
import dataclasses
import posixpath
import re
import time
from dataclasses import dataclass

from console.errors import ConsoleError, TransportError
from console.hosts.host import Host, HostPool
from console.hosts.push import PushReport
from console.scheduler import scheduler_for
from console.scheduler.launch import LaunchHooks, new_run_id, push_for, start_anyway
from console.scheduler.registry import Run, host_records, runs_dir
from console.scheduler.run_record import RunRecord
from console.scheduler.run_status import RunStatus, combined_status
from console.scheduler.slurm import SlurmScheduler
from console.scheduler.ssh import host_address, start_nodes, stop_on
from console.settings.config import Config, Pipeline, Profile

ADDRESS_FILE = "store.addr"
#: how long the store may take to announce its address (a Mooncake master starts in ~1 s)
ADDRESS_WAIT_S = 60.0
#: what engine/stream/address.py accepts: HOST:RPC_PORT/METADATA_PORT
_HOST = re.compile(r"^[A-Za-z0-9.\-]+$")
_ADDRESS = re.compile(r"^[A-Za-z0-9.\-]+:\d{1,5}/\d{1,5}$")
#: what the engine puts after an unexpected error's line
DEBUG_HINT = " (run with --debug for the traceback)"
#: a stream run's name: engine/stream/keys.py's rule (1-64 letters, digits, _ . -)
_RUN_MAX = 64


#: a store's own end says nothing of the outcome, unless it failed
_STORE_OUTCOMES = (RunStatus.FAILED, RunStatus.LOST, RunStatus.CORRUPT)


@dataclass(frozen=True)
class PipelineRun:
    """One pipeline: every record of its parts known (a multi-node trainer has several)."""

    id: str
    records: tuple[RunRecord, ...]

    def part(self, name: str) -> list[RunRecord]:
        """The records of one part, node 0 first."""
        return sorted((r for r in self.records if r.part == name), key=lambda r: r.node_rank)

    def part_status(self, name: str) -> RunStatus | None:
        """One part's status (its nodes combined); None for a part that never started."""
        recs = self.part(name)
        return combined_status([r.status for r in recs]) if recs else None

    @property
    def status(self) -> RunStatus:
        work = [r.status for r in self.records if r.part != "store"]
        store = [r.status for r in self.records if r.part == "store"]
        if not work or any(s.active for s in work):
            return combined_status(work + store)
        return combined_status(work + [s for s in store if s in _STORE_OUTCOMES])

    @property
    def start(self) -> float | None:
        return min((r.start for r in self.records if r.start), default=None)

    @property
    def end(self) -> float | None:
        ends = [r.end for r in self.records if r.part != "store"]
        return None if self.status.active or not all(ends) else max(e or 0.0 for e in ends)

    @property
    def lingering(self) -> list[RunRecord]:
        """Store records still running after the producer and the trainer have ended."""
        if self.status.active:
            return []
        return [r for r in self.part("store") if r.status == RunStatus.RUNNING]


def pipelines(records: list[RunRecord]) -> dict[str, PipelineRun]:
    """The pipelines the records belong to, by id."""
    by: dict[str, list[RunRecord]] = {}
    for r in records:
        if r.pipeline:
            by.setdefault(r.pipeline, []).append(r)
    return {pid: PipelineRun(pid, tuple(recs)) for pid, recs in by.items()}


def part_id(pipeline_id: str, part: str) -> str:
    return f"{pipeline_id}.{part}"


def stream_run(pipeline_id: str) -> str:
    """The stream run's name for `{stream_run}`: the pipeline's id, its end kept if too long."""
    return pipeline_id[-_RUN_MAX:].lstrip("._-") or "stream"


def fill(profile: Profile, name: str, address: str, run: str) -> Profile:
    """A part's profile as it starts: recorded under the pipeline's name, `{stream}` and
    `{stream_run}` filled in."""
    text = profile.run.replace("{stream}", address).replace("{stream_run}", run)
    return dataclasses.replace(profile, name=name, run=text)


def store_profile(profile: Profile, pipe: Pipeline, address: str) -> Profile:
    return Profile(name=profile.name, hosts=[pipe.store_host], env=pipe.store_env,
                   sync=profile.sync,
                   run=f"engine stream-master --host {address} --address-file "
                       f"{{run_dir}}/{ADDRESS_FILE}")


async def launch_pipeline(config: Config, profile: Profile, pool: HostPool, *,
                          force: bool = False, hooks: LaunchHooks | None = None) -> Run:
    """Push to every part's host, start the store, wait for its address, then the producer and
    the trainer (module docstring); the records of every part, under the pipeline's id."""
    pipe = profile.pipeline
    if pipe is None:
        raise ConsoleError(f"profile {profile.name!r} is not a pipeline")
    name = profile.name
    hosts = {h: await pool.ensure(h) for h in profile.hosts}
    async def listed() -> list[tuple[Host, RunRecord]]:
        found = await asyncio.gather(*(scheduler_for(h.cfg).status(h) for h in hosts.values()))
        return [(h, r) for h, recs in zip(hosts.values(), found, strict=True) for r in recs
                if r.profile == name]

    mine = await listed()
    # an earlier pipeline's store whose producer and trainer have ended waits for nothing
    # (nobody followed it to its end): stopped, as `follow` and the Runs pane would
    ids = {r.id for p in pipelines([r for _h, r in mine]).values() for r in p.lingering}
    if ids:
        await asyncio.gather(*(stop_on(h, r.id, 5.0) for h, r in mine if r.id in ids
                               and r.status == RunStatus.RUNNING), return_exceptions=True)
        mine = await listed()
    if not force:   # early and friendly; the store's start checks again under the lock
        busy = [r for _h, r in mine if r.status.active]
        if busy:
            where = ", ".join(sorted({f"{r.id} on {r.host}" for r in busy}))
            await start_anyway(name, busy, where, hooks)
            force = True
    syncs = {h: sorted({*profile.sync, *(s for p in (pipe.producer, pipe.trainer)
                                          if h in p.hosts for s in p.sync)}) for h in hosts}
    pushed = await asyncio.gather(*(push_for(config, dataclasses.replace(profile, sync=syncs[h]),
                                             host, hooks) for h, host in hosts.items()))
    pushes = dict(zip(hosts, pushed, strict=True))
    pid = new_run_id(name)
    store = hosts[pipe.store_host]
    address = pipe.store_address or await host_address(store)
    if not _HOST.match(address):
        raise ConsoleError(f"{store.name} is reached at {address!r}, which a stream's address "
                           f"cannot hold (a host name or an IPv4 address): set address in "
                           f"[profiles.{name}.store]")
    started: list[Run] = []
    try:
        started.append(await _part(store_profile(profile, pipe, address), "store", pid, hosts,
                                   pushes, force=force))
        announced = await _announced(store, part_id(pid, "store"))
        run = stream_run(pid)
        for which, part in (("producer", pipe.producer), ("trainer", pipe.trainer)):
            started.append(await _part(fill(part, name, announced, run), which, pid, hosts,
                                       pushes, force=True))
    except BaseException:
        await _take_down(started, hosts)
        raise
    records = [r for s in started for r in s.records]
    return Run(pid, records, list(pushes.values()))


async def _part(profile: Profile, part: str, pid: str, hosts: dict[str, Host],
                pushes: dict[str, PushReport], *, force: bool) -> Run:
    nodes = [hosts[h] for h in profile.hosts]
    extra = {"pipeline": pid, "part": part}
    if nodes[0].cfg.scheduler == "slurm":   # one login node; the job's nodes come from Slurm
        return await SlurmScheduler().submit_pushed(profile, nodes[0], pushes[nodes[0].name],
                                                    part_id(pid, part), force=force,
                                                    extra=extra)
    if len({(n.cfg.ssh, n.cfg.root) for n in nodes}) != len(nodes):
        raise ConsoleError(f"[profiles.{profile.name}.{part}] hosts: two nodes share one host "
                           "and root")
    return await start_nodes(profile, nodes, part_id(pid, part), [pushes[n.name] for n in nodes],
                             force=force, extra=extra)


async def _announced(store: Host, run_id: str) -> str:
    """The address the store wrote to its file, once it has; a store that ended first (or
    never wrote it) is a one-line error with its last words."""
    run_dir = posixpath.join(await runs_dir(store), run_id)
    path = posixpath.join(run_dir, ADDRESS_FILE)
    deadline = time.monotonic() + ADDRESS_WAIT_S
    while True:
        try:
            text = (await store.transport.read_range(path, 0, 256)).decode("utf-8", "replace")
        except TransportError:
            text = ""
        if text.endswith("\n") and _ADDRESS.match(text.strip()):
            return text.strip()
        recs = await host_records(store, run_id)
        ended = next((r for r in recs if not r.status.active), None)
        if ended is not None or time.monotonic() > deadline:
            why = ended.failure if ended is not None and ended.failure else \
                await _last_words(store, run_dir)
            state = f"{ended.status}" if ended is not None else \
                f"gave no address within {ADDRESS_WAIT_S:.0f} s"
            raise ConsoleError(f"the pipeline's store on {store.name} {state}"
                               + (f": {why}" if why else ""))
        await asyncio.sleep(0.2)


async def _last_words(host: Host, run_dir: str) -> str:
    """The last line of a run's stderr (the engine's `error: ...`, its words alone), or ""."""
    try:
        data = await host.transport.read_range(posixpath.join(run_dir, "output.log"), 0, 1 << 16)
    except TransportError:
        return ""
    lines = [ln for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1].removeprefix("error: ").removesuffix(DEBUG_HINT) if lines else ""


async def _take_down(started: list[Run], hosts: dict[str, Host]) -> None:
    """Stop the parts already started, the last first (as any stop: by PID and start time,
    or scancel)."""
    for run in reversed(started):
        await asyncio.gather(*(scheduler_for(hosts[r.host].cfg).stop(hosts[r.host], [r], 5.0)
                               for r in run.records if r.host in hosts),
                             return_exceptions=True)

