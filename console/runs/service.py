"""Runs: launch a profile, list a host's registry, find, stop and resume a run, forget ended
ones, whatever places them.

Each host's scheduler (console/scheduler: `ssh` runs detached processes through the host-side
runner, `slurm` submits batch jobs) does the work; the records both read live in
console/scheduler/registry.py, the launch steps they share in console/scheduler/launch.py.
"""

from __future__ import annotations

import asyncio
import shlex

from console.errors import CommandFailed, ConsoleError, TransportError, Unreachable
from console.hosts.host import Host, HostPool, HostState
from console.scheduler import scheduler_for
from console.scheduler.launch import LaunchHooks
from console.scheduler.pipeline import launch_pipeline
from console.scheduler.registry import PruneReport, Run, host_prune
from console.scheduler.run_record import RunRecord
from console.scheduler.run_status import RunStatus
from console.settings.config import Config


async def list_runs(host: Host, run_id: str | None = None) -> list[RunRecord]:
    """The host's run records, oldest first, as its scheduler sees them (console/scheduler:
    `lost` processes on an SSH host; squeue/sacct's word on a Slurm job)."""
    return await scheduler_for(host.cfg).status(host, run_id)



async def launch(config: Config, name: str, pool: HostPool, *, force: bool = False,
                 hooks: LaunchHooks | None = None) -> Run:
    """Push what changed, then start the profile: detached on every one of its hosts, or
    queued with the cluster's scheduler (console/scheduler). hooks: progress, and whether to
    start a second copy of a running profile (console/scheduler/launch.py)."""
    profile = config.profile(name)
    if profile.pipeline is not None:   # a store, a producer and a trainer under one id
        return await launch_pipeline(config, profile, pool, force=force, hooks=hooks)
    cfg = config.host(profile.hosts[0])
    return await scheduler_for(cfg).submit(config, profile, pool, force=force, hooks=hooks)



class RunNotFound(ConsoleError):
    """Every configured host that could hold the run answered, and none has it."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run {run_id!r} on any configured host")


class RunHostDown(Unreachable):
    """No host that answered has the run, and one that could hold it could not be asked (a
    dropped link, a host not answering): the run may be there (follow looks again,
    console/commands/follow.py). `down`: those hosts' errors; `host`: the first of them."""

    def __init__(self, run_id: str, down: list[TransportError]) -> None:
        names = list(dict.fromkeys(e.host for e in down))
        first = down[0]
        reason = str(first).removeprefix(f"{first.host}: ")
        super().__init__(", ".join(names), f"could not be reached ({reason}); run {run_id} "
                                           "may be there: try again once it answers")
        self.host = first.host
        self.down = down


async def find_run(config: Config, run_id: str, pool: HostPool) -> list[tuple[Host, RunRecord]]:
    """Every node record of run_id: the hosts of the profile the id names first, then the rest.
    RunNotFound when no host has it; RunHostDown when a host that could hold it could not be
    asked."""
    preferred = list(dict.fromkeys(h for p in config.profiles.values()
                                   if run_id.startswith(p.name + "-") for h in p.hosts))
    rest = [h for h in config.hosts if h not in preferred]
    down: list[TransportError] = []
    for group in (preferred, rest):
        found = await asyncio.gather(*(_records_on(pool, h, run_id) for h in group))
        hits = [hit for hs, _ in found for hit in hs]
        if hits:
            return sorted(hits, key=lambda hr: hr[1].node_rank)
        # a run id that names a profile lives on that profile's hosts: only theirs count
        if group is preferred or not preferred:
            down += [e for _, e in found if e is not None]
    if down:
        raise RunHostDown(run_id, down)
    raise RunNotFound(run_id)



#: how long a host that could hold a run may take to connect and answer a no-op before the
#: lookup calls it unreachable: a frozen host's link looks up for a minute (keepalives), and a
#: reconnect to a host that never answers takes minutes more
REACH_TIMEOUT = 20.0


async def _reach(pool: HostPool, name: str) -> Host:
    """The host connected and answering (`true` runs), or Unreachable within REACH_TIMEOUT."""
    async def answering() -> Host:
        host = await pool.ensure(name)   # the hosts list shows it connecting (or failing)
        await host.transport.run(["true"])
        return host
    try:
        return await asyncio.wait_for(answering(), REACH_TIMEOUT)
    except asyncio.TimeoutError:
        why = f"no answer within {REACH_TIMEOUT:.0f} s"
        if pool.state[name] in (HostState.CONNECTING, HostState.RECONNECTING):
            pool.set_state(name, HostState.FAILED, why)   # not left "connecting" for ever
        raise Unreachable(name, why) from None


async def _records_on(pool: HostPool, name: str, run_id: str
                      ) -> tuple[list[tuple[Host, RunRecord]], TransportError | None]:
    """The host's records of run_id, and the error of a host that could not be asked for a
    reason that passes (a link down, a host not answering, not a refused key or login)."""
    if "/" in run_id or run_id in ("", ".", ".."):
        return [], None
    try:
        host = await _reach(pool, name)
        return [(host, r) for r in await list_runs(host, run_id)], None
    except TransportError as e:
        # an unreachable host cannot hold the run we can act on (now)
        dropped = isinstance(e, Unreachable) or (
            isinstance(e, CommandFailed) and not pool[name].transport.connected)
        return [], e if dropped else None



async def prune_runs(host: Host) -> PruneReport:
    """Forget the host's ended runs: their records and logs are deleted, files they wrote
    (an engine's out/) stay, running and queued runs stay, nothing is signalled. The records
    are listed first, so a Slurm host records what its scheduler says of each job before."""
    await list_runs(host)
    return await host_prune(host)



async def stop_run(config: Config, run_id: str, pool: HostPool, grace: float = 10.0) -> Run:
    """Stop every node: SIGTERM its process group, SIGKILL after grace (an SSH host), or
    scancel (a Slurm job); records say `stopped`."""
    nodes = await find_run(config, run_id, pool)
    by_host: dict[str, tuple[Host, list[RunRecord]]] = {}
    for h, rec in nodes:
        by_host.setdefault(h.name, (h, []))[1].append(rec)
    done = await asyncio.gather(*(scheduler_for(h.cfg).stop(h, recs, grace)
                                  for h, recs in by_host.values()))
    return Run(run_id, sorted((r for recs in done for r in recs), key=lambda r: r.node_rank))


#: the commands that continue from their own checkpoints with `--resume` (profile run words)
RESUMABLE = (("engine", "train"),)


async def resume_run(config: Config, run_id: str, pool: HostPool, *, host: str | None = None,
                     force: bool = False, hooks: LaunchHooks | None = None) -> Run:
    """Start a stopped, failed or lost run again: its profile's command, in the same run
    directory (so `{run_dir}/out` holds its checkpoints) under the same id, with `--resume`.
    Refused, naming why, for a run still active or that succeeded, a profile that is gone, or
    a command without `--resume` (only `engine train` has one)."""
    nodes = [hr for hr in await find_run(config, run_id, pool) if host in (None, hr[0].name)]
    if not nodes:
        raise ConsoleError(f"no run {run_id!r} on {host}")
    rec = nodes[0][1]
    status = RunStatus.CORRUPT if any(r.status == RunStatus.CORRUPT for _h, r in nodes) else \
        Run(run_id, [r for _h, r in nodes]).status
    if status not in (RunStatus.STOPPED, RunStatus.FAILED, RunStatus.LOST):
        why = f"is still {status}" if status.active else f"{status}" \
            if status == RunStatus.SUCCEEDED else "has a corrupt record"
        raise ConsoleError(f"run {run_id} {why}: only a stopped, failed or lost run is resumed")
    profile = config.profiles.get(rec.profile)
    if profile is None:
        raise ConsoleError(f"run {run_id}: its profile {rec.profile!r} is not in the config "
                           "(any more): nothing says how to start it again")
    try:
        words = tuple(shlex.split(profile.run)[:2])
    except ValueError:
        words = ()
    if words not in RESUMABLE:
        raise ConsoleError(f"run {run_id}: `{' '.join(words) or profile.run} …` (profile "
                           f"{profile.name}) has no --resume: only `engine train` runs "
                           "continue from their checkpoints")
    cfg = config.host(profile.hosts[0])
    return await scheduler_for(cfg).submit(config, profile, pool, force=force, hooks=hooks,
                                           resume=run_id)
