"""Slurm clusters: a run is a batch job submitted on the login node (a host with
`scheduler = "slurm"`; its root is on the filesystem the nodes share).

`submit` pushes code to the shared root, writes RUN_DIR/job.sh (`#SBATCH` lines from the
host's `[slurm]` defaults and the profile's overrides) and runs `sbatch --parsable` through the
host-side runner, which records the run `pending` with its job id. The script runs
`srun ... runner.py node RUN_DIR` once per node: each node starts the profile's command (under
torchrun with a c10d rendezvous on the allocation's first node when nodes or nproc_per_node >
1) and records running / exit code in the run directory, so `follow` reads the same files as
on a plain host. `status` takes the records and, for a job they do not finish, what squeue
(then sacct) says: pending with its reason and queue position, or how it ended without the
run saying so (cancelled while pending, failed before start, node failure, time limit), which
is then written into the record (`settle`). `stop` writes the stop marker, `scancel
--signal=TERM`, waits up to the grace period, then `scancel`: no login-node pid is signalled.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import shlex
import time
from dataclasses import dataclass
from typing import Any

from console.errors import ConfigError, ConsoleError
from console.hosts.host import Host, HostPool
from console.hosts.push import HOSTSIDE_PACKAGE, PushReport
from console.scheduler.base import Scheduler
from console.scheduler.launch import (
    LaunchHooks,
    build_argv,
    new_run_id,
    push_for,
    run_env,
    start_anyway,
    substitute,
)
from console.scheduler.registry import RUNNER, Run, host_records, runner
from console.scheduler.run_record import RunRecord
from console.scheduler.run_status import RunStatus, combined_status
from console.settings.config import Config, HostConfig, Profile
from console.settings.slurm_options import SlurmOptions, missing

#: squeue states of a job that is not over yet
QUEUED = ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
          "SUSPENDED")
STARTED = ("RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "STOPPED")
#: a finished job's state -> (status, reason) when its record did not say how it ended
_S, _F = RunStatus.STOPPED, RunStatus.FAILED
JOB_ENDED: dict[str, tuple[RunStatus, str]] = {
    "CANCELLED": (_S, "cancelled"), "PREEMPTED": (_S, "preempted"),
    "TIMEOUT": (_F, "time limit"), "NODE_FAIL": (_F, "node failure"),
    "BOOT_FAIL": (_F, "node boot failure"), "OUT_OF_MEMORY": (_F, "out of memory"),
    "DEADLINE": (_F, "deadline"), "FAILED": (_F, "the job failed"),
    "COMPLETED": (RunStatus.LOST, "the job ended but the run did not record its end"),
    "SPECIAL_EXIT": (_F, "special exit"), "REVOKED": (_S, "revoked"),
}
#: how long after its end a record is still asked about (to learn e.g. a time limit)
RECENT_S = 600.0
SQUEUE_FORMAT = "%i|%T|%r|%P|%D|%N"


@dataclass
class Job:
    """One job as squeue or sacct sees it."""

    id: str
    state: str
    reason: str = ""
    partition: str = ""
    nodes: str = ""
    position: int | None = None


def options_for(cfg: HostConfig, profile: Profile) -> SlurmOptions:
    """The host's [slurm] defaults with the profile's overrides; partition and account set."""
    opts = (cfg.slurm or SlurmOptions()).merged(profile.slurm)
    for key in missing(opts):
        raise ConfigError(f"[profiles.{profile.name}] no Slurm {key}: set {key} in "
                          f"[hosts.{cfg.name}.slurm] or [profiles.{profile.name}.slurm]")
    return opts


def slurm_env(opts: SlurmOptions) -> dict[str, str]:
    return {"SLURM_CONF": opts.conf} if opts.conf else {}


def batch_script(run_id: str, opts: SlurmOptions, nodes: int, python: str, runner_path: str,
                 run_dir: str) -> str:
    """RUN_DIR/job.sh: the #SBATCH lines, then one host-side runner per node under srun
    (output and error paths go on sbatch's command line: no quoting rules of #SBATCH)."""
    q = shlex.quote
    return "\n".join([
        "#!/bin/sh",
        f"# eagle3-console run {run_id}: one runner per node starts the profile's command",
        *opts.sbatch_lines(nodes),
        f"exec srun --nodes={nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 "
        f"{q(python)} -B {q(runner_path)} node {q(run_dir)}",
        ""])


def parse_squeue(text: str) -> dict[str, Job]:
    jobs = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 6 and parts[0].isdigit():
            jobs[parts[0]] = Job(parts[0], parts[1].split()[0] if parts[1] else "",
                                 "" if parts[2] == "None" else parts[2], parts[3], parts[5])
    return jobs


def parse_sacct(text: str) -> dict[str, Job]:
    jobs = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 3 and parts[0].isdigit():
            reason = parts[3] if len(parts) > 3 and parts[3] != "None" else ""
            jobs[parts[0]] = Job(parts[0], parts[1].split()[0] if parts[1] else "", reason,
                                 parts[4] if len(parts) > 4 else "",
                                 parts[5] if len(parts) > 5 else "")
    return jobs


def judge(rec: RunRecord, job: Job | None) -> tuple[RunStatus, str, bool]:
    """(status, reason, settle): what to show for a Slurm record given the scheduler's job, and
    whether to write it into the record (the job is over and the record did not say so)."""
    was = rec.status
    settled = bool(rec.slurm and rec.slurm.state)   # the end was written back once already
    if job is None:
        if was.active:
            return RunStatus.LOST, f"Slurm no longer knows job {rec.job_id or '?'}", False
        return was, rec.reason, False
    if job.state in QUEUED:
        if was == RunStatus.PENDING or job.state == "PENDING":
            where = f"#{job.position} " if job.position else ""
            return RunStatus.PENDING, f"{where}{job.reason}".strip(), False
        return was, job.reason, False
    if job.state in STARTED:
        return (RunStatus.RUNNING if was.active else was), "", False
    status, reason = JOB_ENDED.get(job.state, (RunStatus.FAILED, job.state.lower()))
    if not was.active:  # the run recorded its end: keep it, learn why (e.g. time limit)
        if job.state in ("COMPLETED", "FAILED", "CANCELLED"):
            return was, rec.reason, not settled
        return was, reason, not settled
    if was == RunStatus.PENDING:
        if job.state == "FAILED":
            reason = "failed before start" + (f": {job.reason}" if job.reason else "")
        elif job.state == "CANCELLED":
            reason = "cancelled before it started"
    return status, reason, True


def end_reason(job: Job) -> str:
    """Why a job ended, when that is worth saying beside the run's own exit (a time limit, a
    node failure); "" for one that finished, failed or was cancelled."""
    if job.state in ("COMPLETED", "FAILED", "CANCELLED"):
        return ""
    return JOB_ENDED.get(job.state, (RunStatus.FAILED, job.state.lower()))[1]


class SlurmScheduler(Scheduler):
    name = "slurm"

    # -- submit -----------------------------------------------------------------------------

    async def submit(self, config: Config, profile: Profile, pool: HostPool, *,
                     force: bool = False, hooks: LaunchHooks | None = None,
                     resume: str | None = None) -> Run:
        host = pool[profile.hosts[0]]
        if resume is not None:
            raise ConsoleError(f"{host.name}: resuming {resume} on a Slurm host is not "
                               f"supported yet: launch {profile.name} with --resume in its run")
        options_for(host.cfg, profile)   # partition and account set, before any push
        await pool.ensure(host.name)
        if not force:  # early and friendly; the runner checks again under the profile lock
            busy = [r for r in await self.status(host)
                    if r.profile == profile.name and r.status.active]
            if busy:
                where = ", ".join(f"{r.id} (job {r.job_id}, {r.status})" for r in busy)
                force = await start_anyway(profile.name, busy, where, hooks, queued=True)
        report = await push_for(config, profile, host, hooks)
        return await self.submit_pushed(profile, host, report, new_run_id(profile.name),
                                        force=force)

    async def submit_pushed(self, profile: Profile, host: Host, report: PushReport,
                            run_id: str, *, force: bool = False,
                            extra: dict[str, Any] | None = None) -> Run:
        """Write run_id's batch script and sbatch it (the code pushed already, `report`).
        extra: more fields for the record (a pipeline's part)."""
        opts = options_for(host.cfg, profile)
        root = await host.root()
        run_dir = posixpath.join(root, "runs", run_id)
        if "%" in run_dir or "\\" in run_dir:
            raise ConfigError(f"[hosts.{host.name}] root {root!r}: sbatch reads % and \\ in "
                              f"output paths as patterns; use a root without them")
        argv, is_engine = build_argv(profile, host.cfg, run_id=run_id, node_rank="{node_rank}",
                                     rdzv="{rdzv_endpoint}", run_dir=run_dir,
                                     nnodes=profile.nodes)
        env = run_env(profile, host.cfg)
        env.setdefault("PYTHONUNBUFFERED", "1")
        code = await host.code_dir()
        out = posixpath.join(run_dir, "slurm-%j.out")
        spec = {
            "id": run_id, "profile": profile.name, "host": host.name, "node_rank": 0,
            "nnodes": profile.nodes, "argv": argv,
            "cwd": (await host.resolve(substitute(profile.cwd, run_id, run_dir))
                    if profile.cwd else root),
            "env": env, "path_prepend": {"PYTHONPATH": code},
            "stdout": "events.jsonl" if is_engine else "output.log", "stderr": "output.log",
            "engine": is_engine, "run_dir": run_dir, "push": report.record(),
            "scheduler": "slurm",
            "slurm": {"partition": opts.partition, "account": opts.account, "qos": opts.qos,
                      "time": opts.time, "nodes": profile.nodes,
                      "gpus_per_node": opts.gpus_per_node},
            "rdzv_host": profile.env.get("MASTER_ADDR"),
            "rdzv_port": int(profile.env["MASTER_PORT"]) if "MASTER_PORT" in profile.env
            else None,
            "script": batch_script(run_id, opts, profile.nodes, host.cfg.python,
                                   posixpath.join(code, HOSTSIDE_PACKAGE, RUNNER), run_dir),
            "sbatch": ["--parsable", f"--job-name=eagle3-{run_id}", f"--output={out}",
                       f"--error={out}", f"--chdir={run_dir}"],
            "slurm_env": slurm_env(opts), **(extra or {}),
        }
        args = ["submit", run_dir] if force else ["submit", run_dir, "--unless-running"]
        await runner(host, args, input=json.dumps(spec))
        return Run(run_id, await self.status(host, run_id), [report])

    # -- status -----------------------------------------------------------------------------

    async def status(self, host: Host, run_id: str | None = None) -> list[RunRecord]:
        recs = await host_records(host, run_id)
        now = time.time()
        ask = [r for r in recs if r.slurm is not None and r.job_id and (
            r.status.active or (not r.slurm.state and r.end and now - r.end < RECENT_S))]
        if not ask:
            return [self._combined(r) for r in recs]
        try:
            jobs = await self.jobs(host, [r.job_id for r in ask])
        except ConsoleError as e:  # the registry still lists; the record says why it is stale
            stale = {r.id: r.judged(reason=str(e)) for r in ask if r.status.active}
            return [self._combined(stale.get(r.id, r)) for r in recs]
        out = {r.id: r for r in recs}
        for r in ask:
            job = jobs.get(r.job_id)
            status, reason, settle = judge(r, job)
            if settle and job is not None:
                change = {"status": status, "reason": reason, "slurm_state": job.state,
                          "end_reason": end_reason(job)}
                data = await runner(host, ["settle", r.run_dir], input=json.dumps(change))
                if isinstance(data, dict):  # the record as it now stands on disk
                    r = out[r.id] = RunRecord.from_dict(data, host.name)
            else:
                r = out[r.id] = r.judged(status, reason=reason)
            if job is not None:
                r = out[r.id] = r.judged(partition=job.partition or r.partition,
                                         nodelist=job.nodes or r.nodelist)
        return [self._combined(r) for r in out.values()]

    @staticmethod
    def _combined(rec: RunRecord) -> RunRecord:
        """A finished multi-node job: failed when any node failed, though node 0 succeeded."""
        nodes = rec.slurm.node_statuses if rec.slurm else ()
        if not rec.status.active and nodes:
            return rec.judged(combined_status([rec.status, *nodes]))
        return rec

    async def jobs(self, host: Host, ids: list[str]) -> dict[str, Job]:
        """squeue's view of the user's jobs (sacct's for those it has forgotten), with the
        queue position of pending ones in their partition."""
        env = slurm_env(host.cfg.slurm or SlurmOptions())
        res = await host.transport.run(["squeue", "-h", "-t", "all", "--me", "-o",
                                        SQUEUE_FORMAT], env=env, timeout=60)
        if not res.ok:
            raise ConsoleError(f"squeue failed: {_last_line(res.stderr)}")
        jobs = parse_squeue(res.stdout)
        gone = [i for i in ids if i not in jobs]
        if gone:  # older than MinJobAge: accounting knows (when the cluster keeps it)
            res = await host.transport.run(
                ["sacct", "-n", "-P", "-X", "-j", ",".join(gone), "-o",
                 "JobID,State,ExitCode,Reason,Partition,NodeList"], env=env, timeout=60)
            if res.ok:
                jobs.update(parse_sacct(res.stdout))
        if any(j.state == "PENDING" for i, j in jobs.items() if i in ids):
            res = await host.transport.run(["squeue", "-h", "-t", "PENDING", "--sort=-p,i",
                                            "-o", "%i|%P"], env=env, timeout=60)
            if res.ok:
                seen: dict[str, int] = {}
                for line in res.stdout.splitlines():
                    jid, _, part = line.strip().partition("|")
                    seen[part] = seen.get(part, 0) + 1
                    if jid in jobs:
                        jobs[jid].position = seen[part]
        return jobs

    # -- stop -------------------------------------------------------------------------------

    async def stop(self, host: Host, records: list[RunRecord], grace: float) -> list[RunRecord]:
        return list(await asyncio.gather(*(self._stop_one(host, r, grace) for r in records)))

    async def _stop_one(self, host: Host, rec: RunRecord, grace: float) -> RunRecord:
        if rec.slurm is None:
            raise ConsoleError(f"{rec.id} on {host.name}: not a Slurm record")
        now = (await self.status(host, rec.id) or [rec])[0]
        if not now.status.active or not now.job_id:
            return now
        env = slurm_env(host.cfg.slurm or SlurmOptions())
        await runner(host, ["mark-stop", now.run_dir])
        job = now.job_id
        if now.status == RunStatus.RUNNING:  # TERM first: the runner hands it to its group
            await self._scancel(host, ["--signal=TERM", job], env)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and await self._alive(host, job, env):
                await asyncio.sleep(0.3)
        if await self._alive(host, job, env):
            await self._scancel(host, [job], env)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and await self._alive(host, job, env):
                await asyncio.sleep(0.3)
        return (await self.status(host, rec.id) or [now])[0]

    async def _scancel(self, host: Host, args: list[str], env: dict[str, str]) -> None:
        res = await host.transport.run(["scancel", *args], env=env, timeout=60)
        if not res.ok and "already completing or completed" not in res.stderr:
            raise ConsoleError(f"{host.name}: scancel {' '.join(args)}: "
                               f"{_last_line(res.stderr)}")

    async def _alive(self, host: Host, job: str, env: dict[str, str]) -> bool:
        res = await host.transport.run(["squeue", "-h", "-t", "all", "--me", "-o",
                                        SQUEUE_FORMAT], env=env, timeout=60)
        found = parse_squeue(res.stdout).get(job) if res.ok else None
        return found is not None and (found.state in QUEUED or found.state in STARTED)

    def describe(self, rec: RunRecord) -> dict[str, str]:
        nodes = rec.nodelist or (f"{rec.nnodes} node" + "s" * (rec.nnodes > 1))
        return {"job": rec.job_id, "partition": rec.partition,
                "nodes": str(nodes), "reason": rec.reason}


@dataclass
class Partition:
    """One partition as sinfo sees it: nodes, idle nodes, GPUs and free GPUs (on nodes that
    can take work)."""

    name: str
    nodes: int = 0
    idle: int = 0
    down: int = 0
    gpus: int = 0
    free_gpus: int = 0

    def text(self) -> str:
        """One line for the fleet view."""
        nodes = f"{self.nodes} node{'s' * (self.nodes != 1)}, {self.idle} idle" + \
            (f", {self.down} down" if self.down else "")
        gpus = f"GPUs {self.free_gpus} free of {self.gpus}" if self.gpus else "no GPUs"
        return f"{self.name}: {nodes} · {gpus}"


SINFO_FORMAT = "PartitionName:|,StateCompact:|,Gres:|,GresUsed:|,NodeList:|"
#: node states (sinfo's compact names, flags stripped) whose free GPUs can be allocated
USABLE = ("idle", "mix", "alloc", "comp", "plnd", "resv")


def gres_gpus(text: str) -> int:
    """The GPU count in a Gres/GresUsed string: `gpu:8`, `gpu:h100:4(S:0-1)`,
    `gpu:a100:2(IDX:0-1),shard:4`; 0 for `(null)` or no gpu entry."""
    total = 0
    depth, item, items = 0, "", []
    for ch in text:  # split on commas outside parentheses (IDX:0,2 lists)
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            items.append(item)
            item = ""
        else:
            item += ch
    items.append(item)
    for it in items:
        parts = it.split("(", 1)[0].split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def parse_sinfo(text: str) -> list[Partition]:
    """`sinfo -h -N -O SINFO_FORMAT` lines (one per node and partition), per partition."""
    out: dict[str, Partition] = {}
    for line in text.splitlines():
        f = line.split("|")
        if len(f) < 5 or not f[0]:
            continue
        p = out.setdefault(f[0], Partition(f[0]))
        state = f[1].strip().rstrip("*~#!%$@^-+").lower()
        total, used = gres_gpus(f[2]), gres_gpus(f[3])
        p.nodes += 1
        p.idle += state == "idle"
        p.down += state not in USABLE
        p.gpus += total
        if state in USABLE:
            p.free_gpus += max(0, total - used)
    return list(out.values())


async def partitions(host: Host) -> list[Partition]:
    """The cluster's partitions, from sinfo on the login node."""
    await host.connect()
    env = slurm_env(host.cfg.slurm or SlurmOptions())
    res = await host.transport.run(["sinfo", "-h", "-N", "-O", SINFO_FORMAT], env=env,
                                   timeout=60)
    if not res.ok:
        raise ConsoleError(f"{host.name}: sinfo failed: {_last_line(res.stderr)}")
    return parse_sinfo(res.stdout)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "no message"
