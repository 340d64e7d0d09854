"""Plain SSH hosts: the run is a detached process tree on each named host, started, listed and
stopped by the host-side runner (console/hostside/runner.py). Several hosts make one run: node 0
starts first, the others meet it at a c10d rendezvous on the first host, and if one node cannot
start the others are taken down."""

from __future__ import annotations

import asyncio
import json
import posixpath
from typing import Any

from console.errors import ConfigError
from console.hosts.host import Host, HostPool
from console.hosts.push import PushReport
from console.hostside.runner import HOLD_MAX_S
from console.scheduler.base import Scheduler
from console.scheduler.launch import (
    LaunchHooks,
    Rendezvous,
    build_argv,
    new_run_id,
    push_for,
    run_env,
    start_anyway,
    substitute,
)
from console.scheduler.registry import Run, host_records, runner, runs_dir
from console.scheduler.run_record import RunRecord
from console.scheduler.run_status import RunStatus
from console.settings.config import Config, HostConfig, Profile


class SshScheduler(Scheduler):
    name = "ssh"

    async def submit(self, config: Config, profile: Profile, pool: HostPool, *,
                     force: bool = False, hooks: LaunchHooks | None = None,
                     resume: str | None = None) -> Run:
        return await launch_on_hosts(config, profile, pool, force=force, hooks=hooks,
                                     resume=resume)

    async def status(self, host: Host, run_id: str | None = None) -> list[RunRecord]:
        return await host_records(host, run_id)

    async def stop(self, host: Host, records: list[RunRecord], grace: float) -> list[RunRecord]:
        return list(await asyncio.gather(*(stop_on(host, r.id, grace) for r in records)))


async def launch_on_hosts(config: Config, profile: Profile, pool: HostPool, *,
                          force: bool = False, hooks: LaunchHooks | None = None,
                          resume: str | None = None) -> Run:
    """The plain-SSH launch: detached on every one of the profile's hosts, node 0 first.
    resume: an ended run's id, started again under that id in its directory (its {run_dir}),
    with `--resume` added to the command."""
    name = profile.name
    nodes = [pool[h] for h in profile.hosts]
    if len({(n.cfg.ssh, n.cfg.root) for n in nodes}) != len(nodes):
        raise ConfigError(f"[profiles.{name}] hosts: two nodes share one host and root")
    await asyncio.gather(*(pool.ensure(h) for h in profile.hosts))
    if not force:  # early and friendly; the runner checks again, under its lock, at the start
        found = await asyncio.gather(*(host_records(n) for n in nodes))
        busy = [r for recs in found for r in recs
                if r.profile == name and r.status == RunStatus.RUNNING]
        if busy:
            where = ", ".join(sorted({f"{r.id} on {r.host}" for r in busy}))
            force = await start_anyway(name, busy, where, hooks)
    pushes = list(await asyncio.gather(*(push_for(config, profile, n, hooks) for n in nodes)))
    run_id = resume or new_run_id(name)
    return await start_nodes(profile, nodes, run_id, pushes, force=force,
                             again=resume is not None)


async def start_nodes(profile: Profile, nodes: list[Host], run_id: str,
                      pushes: list[PushReport], *, force: bool = False, again: bool = False,
                      extra: dict[str, Any] | None = None) -> Run:
    """Start run_id on every node (pushed already), node 0 first; if one node cannot start,
    the others are taken down and its error raised. extra: more fields for each record."""
    rdzv = await _rendezvous(profile, nodes[0]) if len(nodes) > 1 else None
    # node 0 first: of two launches racing for one profile, the one that starts there wins and
    # the other is refused before it starts anything
    first = await _start_node(profile, nodes[0], 0, run_id, rdzv, pushes[0], force, again,
                              extra)
    starts = [_start_node(profile, nodes[rank], rank, run_id, rdzv, pushes[rank], force, again,
                          extra) for rank in range(1, len(nodes))]
    results = [first, *await asyncio.gather(*starts, return_exceptions=True)]
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        # one node could not start: take the others down rather than leave them waiting
        started = [n for n, r in zip(nodes, results, strict=True)
                   if not isinstance(r, BaseException)]
        await asyncio.gather(*(stop_on(n, run_id, 5.0) for n in started), return_exceptions=True)
        raise failed[0]
    records = await asyncio.gather(*(host_records(n, run_id) for n in nodes))
    return Run(run_id, [r for recs in records for r in recs], pushes)


async def host_address(host: Host) -> str:
    """The address other hosts reach `host` at: its SSH host name, or its first `hostname -I`
    address for an ssh-config alias (127.0.0.1 for this machine)."""
    addr = _ssh_hostname(host.cfg)
    if addr is None:
        res = await host.transport.run_script("hostname -I 2>/dev/null || hostname")
        words = res.stdout.split()
        addr = words[0] if words else host.cfg.ssh or "127.0.0.1"
    return addr


async def _rendezvous(profile: Profile, first: Host) -> Rendezvous:
    addr = profile.env.get("MASTER_ADDR") or await host_address(first)
    port = profile.env.get("MASTER_PORT")
    if port is None:
        port = str(await runner(first, ["freeport"]))
    return Rendezvous(addr, int(port))


def _ssh_hostname(cfg: HostConfig) -> str | None:
    """The host part of user@host[:port], or None for an ssh-config alias (not resolvable by
    the other nodes in general)."""
    if cfg.ssh is None:
        return "127.0.0.1"
    target = cfg.ssh.rsplit("@", 1)[-1]
    if target.startswith("["):
        return target[1:].split("]", 1)[0]
    host = target.rsplit(":", 1)[0] if target.count(":") == 1 else target
    if "." in host or ":" in host or host == "localhost":
        return host
    return None


async def _start_node(profile: Profile, host: Host, rank: int, run_id: str,
                      rdzv: Rendezvous | None, report: PushReport,
                      force: bool = False, resume: bool = False,
                      extra: dict[str, Any] | None = None) -> dict[str, Any]:
    run_dir = posixpath.join(await runs_dir(host), run_id)
    argv, is_engine = build_argv(profile, host.cfg, run_id=run_id, node_rank=rank, rdzv=rdzv,
                                 run_dir=run_dir)
    if resume and "--resume" not in argv:
        argv.append("--resume")
    env = run_env(profile, host.cfg)
    env.setdefault("PYTHONUNBUFFERED", "1")
    spec = {
        "id": run_id, "profile": profile.name, "host": host.name, "node_rank": rank,
        "nnodes": len(profile.hosts), "argv": argv,
        "cwd": (await host.resolve(substitute(profile.cwd, run_id, run_dir)) if profile.cwd
                else await host.root()),
        "env": env, "path_prepend": {"PYTHONPATH": await host.code_dir()},
        "stdout": "events.jsonl" if is_engine else "output.log", "stderr": "output.log",
        "engine": is_engine, "run_dir": run_dir, "push": report.record(),
        "rendezvous": f"{rdzv.host}:{rdzv.port}" if rdzv else None, **(extra or {}),
    }
    # without --force the runner refuses, under a per-profile lock held until the new run is
    # recorded, when the profile already runs there: two launches at once start one run
    args = ["start", run_dir] if force else ["start", run_dir, "--unless-running"]
    if resume:   # the runner starts it again in its directory, only once it has ended
        args.append("--resume")
    result = await runner(host, args, input=json.dumps(spec))
    return dict(result or {})


async def stop_on(host: Host, run_id: str, grace: float) -> RunRecord:
    run_dir = posixpath.join(await runs_dir(host), run_id)
    # the runner waits past the grace while the command holds SIGKILL off (a drafter swapped
    # back into a serving vLLM): at most HOLD_MAX_S
    data = await runner(host, ["stop", run_dir, str(grace)], timeout=grace + HOLD_MAX_S + 60)
    return RunRecord.from_dict(data, host.name)
