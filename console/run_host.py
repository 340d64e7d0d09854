"""Runs on a host: the registry's records, the host-side runner's calls, and the plain-SSH
launch and stop (console/scheduler/ssh.py places runs with them; console/runs.py dispatches).

The registry lives on each host, so it holds whether or not a console was connected:

    ROOT/runs/<run-id>/   (0700; every file in it 0600)
        run.json      the record (written by the host-side monitor, atomically): id, profile,
                      host, node_rank, nnodes, argv, cwd, env, pid, pgid, start, status
                      (running | succeeded | failed | stopped | lost), exit_code, end, push
                      (manifest hash, per-tree hashes, local git commits of pushed folders);
                      env values of keys like *TOKEN*, *KEY*, *SECRET*, *PASSWORD* read ***
        spec.json     what the console asked to run (secrets masked the same way)
        output.log    stdout and stderr of a plain command; stderr of an engine command
        events.jsonl  stdout of an engine command run with --events (engine/events.py lines)
        runner.log    the monitor's own errors (normally empty)
        stop          present once a stop was requested (the exit then reads `stopped`)

A record that cannot be trusted (not JSON, a pid that is not a process id, ...) is listed as
`corrupt` with the reason in raw["error"]; the others list normally. `stop` signals a run's
process group only while its leader is the recorded command (pid and start time); otherwise
the run comes back `lost` with raw["refused"] and nothing is signalled. Launches of one
profile on a host are serialised by ROOT/.launch-<profile>.lock (the runner's "already
running" check and the recorded start happen under it); node 0 starts first.

A run id is `<profile>-<YYYYmmdd-HHMMSS>-<4 hex>`; a multi-node run has the same id and one
directory (one record, its node_rank) on every host. How a profile's `run` string becomes argv:

    engine CMD ...            PYTHON -m engine CMD ... --events  (PYTHONPATH=ROOT/code first)
    python[3] script.py ...   PYTHON script.py ...               (the host's configured Python)
    anything else             as written (split like a shell would, never run by one)

`{run_dir}` and `{run_id}` in the run string or cwd become this run's directory and id (e.g.
`engine train ... --out {run_dir}/out`: a run's outputs live beside its log, ROOT/runs/<id>),

and with nproc_per_node > 1 or several hosts the same under `PYTHON -m torch.distributed.run`
(`--standalone` on one host; `--nnodes N --node-rank R --rdzv-backend c10d --rdzv-endpoint
FIRST_HOST:PORT --rdzv-id RUN_ID` across hosts; the address is the first host's SSH host name,
or its first `hostname -I` address for an ssh-config alias; MASTER_ADDR / MASTER_PORT in the
profile's env override address and port).
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import secrets
import shlex
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from console.config import Config, HostConfig, Profile
from console.engine_client import ensure_engine
from console.errors import CommandFailed, ConfigError, ConsoleError
from console.host import Host
from console.hostside.runner import record_problem
from console.push import HOSTSIDE_PACKAGE, PushReport, engine_trees, push, sync_tree

STATUSES = ("pending", "running", "succeeded", "failed", "stopped", "lost", "corrupt")


RUNNER = "runner.py"   # in ROOT/code/eagle3_hostside, run as a script (see runner())


@dataclass
class RunRecord:
    """One host's record of a run (run.json, with `lost` worked out by the host)."""

    id: str
    host: str
    profile: str
    status: str
    exit_code: int | None
    start: float | None
    end: float | None
    node_rank: int = 0
    nnodes: int = 1
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Any, host: str) -> RunRecord:
        """A record as the runner listed it; one with a field of the wrong type or range (the
        runner checks too, this is the console's own guard) comes back `corrupt`."""
        if isinstance(d, dict) and d.get("status") == "corrupt":
            problem: str | None = str(d.get("error") or "unreadable record")
        else:
            problem = record_problem(d)
        if problem is not None:  # keep only what can be shown safely
            src = d if isinstance(d, dict) else {}
            rid, profile, run_dir = src.get("id"), src.get("profile"), src.get("run_dir")
            raw = {"id": rid if isinstance(rid, str) and rid else "?", "status": "corrupt",
                   "error": problem, "profile": profile if isinstance(profile, str) else "",
                   "run_dir": run_dir if isinstance(run_dir, str) else ""}
            return cls(id=raw["id"], host=host, profile=raw["profile"], status="corrupt",
                       exit_code=None, start=None, end=None, raw=raw)
        return cls(id=d["id"], host=str(d.get("host") or host), profile=d.get("profile") or "",
                   status=d["status"], exit_code=d.get("exit_code"), start=d.get("start"),
                   end=d.get("end"), node_rank=d.get("node_rank") or 0,
                   nnodes=d.get("nnodes") or 1, raw=d)

    @property
    def run_dir(self) -> str:
        return str(self.raw.get("run_dir") or "")

    @property
    def error(self) -> str:
        """Why a `corrupt` record cannot be trusted ("" for any other)."""
        return str(self.raw.get("error") or "") if self.status == "corrupt" else ""

    @property
    def job_id(self) -> str:
        """The Slurm job id of a run on a cluster host ("" elsewhere)."""
        return str(self.raw.get("job_id") or "")

    @property
    def partition(self) -> str:
        """The Slurm partition a job was queued in ("" elsewhere): the runner's own field, or
        what squeue/sacct reported in the record's `slurm` section."""
        slurm = self.raw.get("slurm")
        from_slurm = slurm.get("partition") if isinstance(slurm, dict) else None
        return str(self.raw.get("partition") or from_slurm or "")

    @property
    def reason(self) -> str:
        """What the scheduler says: why a job is pending, or how it ended ("" if nothing)."""
        return str(self.raw.get("reason") or "")

    @property
    def refused(self) -> str:
        """Why `stop` signalled nothing (a `lost` run), "" otherwise."""
        return str(self.raw.get("refused") or "")


@dataclass
class Run:
    """A launched run: its id, one record per node, and what each node's push sent."""

    id: str
    records: list[RunRecord]
    pushes: list[PushReport] = field(default_factory=list)

    @property
    def status(self) -> str:
        return combined_status([r.status for r in self.records])


def combined_status(statuses: Sequence[str]) -> str:
    """One status for a multi-node run: running while any node runs, then the worst outcome."""
    for s in ("running", "pending", "corrupt", "lost", "stopped", "failed"):
        if s in statuses:
            return s
    return "succeeded" if statuses else "lost"


async def runs_dir(host: Host) -> str:
    return posixpath.join(await host.root(), "runs")


async def runner(host: Host, args: Sequence[str], input: str | None = None,
                 timeout: float = 120) -> Any:
    """Run console/hostside/runner.py on the host (pushed with the engine) and decode its JSON.

    As a script with -B, not `-m`: a script is compiled from its source every time, so a
    __pycache__ file that a full disk left truncated cannot break the registry for good."""
    await host.connect()
    await ensure_engine(host)
    code = await host.code_dir()
    argv = [host.cfg.python, "-B", posixpath.join(code, HOSTSIDE_PACKAGE, RUNNER), *args]
    res = await host.transport.run(argv, env={"PYTHONPATH": code}, input=input,
                                   timeout=timeout)
    try:
        data = json.loads(res.stdout) if res.stdout.strip() else None
    except ValueError:
        data = None
    if not res.ok:
        msg = data.get("error") if isinstance(data, dict) else None
        if msg:
            raise ConsoleError(f"{host.name}: {msg}")
        raise CommandFailed(host.name, argv[:4], res.returncode, res.stderr)
    return data


async def host_records(host: Host, run_id: str | None = None) -> list[RunRecord]:
    """The host's run records as the host-side runner lists them (`lost` ones marked)."""
    data = await runner(host, ["list", await runs_dir(host), *([run_id] if run_id else [])])
    return [RunRecord.from_dict(d, host.name) for d in data or []]


def newest_first(records: Sequence[RunRecord]) -> list[RunRecord]:
    """The one order runs are shown in (the runs pane, `runs HOST`): latest start first."""
    return sorted(records, key=lambda r: (r.start or 0.0, r.id), reverse=True)


@dataclass(frozen=True)
class Rendezvous:
    """Where the nodes of a multi-node run meet (c10d on the first host)."""

    host: str
    port: int


def new_run_id(profile: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in profile)
    return f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def substitute(text: str, run_id: str, run_dir: str) -> str:
    """`{run_id}` and `{run_dir}` in a profile's run words and cwd (nothing else is touched:
    other braces, e.g. JSON arguments, stay as written)."""
    return text.replace("{run_dir}", run_dir).replace("{run_id}", run_id)


def build_argv(profile: Profile, cfg: HostConfig, *, run_id: str, node_rank: int | str = 0,
               rdzv: Rendezvous | str | None = None, run_dir: str = "",
               nnodes: int | None = None) -> tuple[list[str], bool]:
    """argv for one node, and whether it is an engine command (see the module docstring).
    nnodes: the node count when it is not len(profile.hosts) (a Slurm job's `nodes`); rdzv
    may be the endpoint as text (a placeholder the node fills in)."""
    try:
        words = [substitute(w, run_id, run_dir) for w in shlex.split(profile.run)]
    except ValueError as e:
        raise ConfigError(f"[profiles.{profile.name}] run: cannot split {profile.run!r}: "
                          f"{e}") from e
    if not words:
        raise ConfigError(f"[profiles.{profile.name}] run: empty command")
    is_engine = words[0] == "engine"
    if is_engine:
        tail = ["-m", "engine", *words[1:]]
        if "--events" not in tail:
            tail.append("--events")
        python_tail: list[str] | None = tail
    elif words[0] in ("python", "python3"):
        python_tail = words[1:]
    else:
        python_tail = None
    if nnodes is None:
        nnodes = len(profile.hosts)
    if profile.nproc_per_node <= 1 and nnodes == 1 or words[0] in ("torchrun",):
        if python_tail is None:
            return words, False
        return [cfg.python, *python_tail], is_engine
    dist = [cfg.python, "-m", "torch.distributed.run",
            "--nproc-per-node", str(profile.nproc_per_node)]
    if nnodes == 1:
        dist.append("--standalone")
    else:
        assert rdzv is not None
        endpoint = rdzv if isinstance(rdzv, str) else f"{rdzv.host}:{rdzv.port}"
        dist += ["--nnodes", str(nnodes), "--node-rank", str(node_rank),
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                 "--rdzv-id", run_id]
    if python_tail is None:
        return [*dist, "--no-python", *words], False
    return [*dist, *python_tail], is_engine


@dataclass
class LaunchHooks:
    """What a launch tells and asks its caller as it goes: the runs pane passes all three; the
    CLI none (a second copy is refused unless --force, and the report is printed at the end)."""

    #: the profile is already running (these records): start another copy?
    confirm: Callable[[list[RunRecord]], Awaitable[bool]] | None = None
    #: a step begins ("pushing to gpu1", "starting")
    step: Callable[[str], None] | None = None
    #: a push's progress on one host: host name, files done, files to send, bytes sent
    progress: Callable[[str, int, int, int], None] | None = None


class NotStarted(ConsoleError):
    """The profile is already running and the caller's confirm hook said not to start another."""


async def start_anyway(name: str, busy: list[RunRecord], where: str,
                       hooks: LaunchHooks | None, queued: bool = False) -> bool:
    """Whether to start although `busy` runs of profile `name` are active: the confirm hook
    decides (False raises NotStarted); without one, a one-line refusal naming them."""
    if hooks is not None and hooks.confirm is not None:
        if await hooks.confirm(busy):
            return True
        raise NotStarted(f"not started: {name} is already running")
    state = "running or queued" if queued else "running"
    raise ConsoleError(f"profile {name!r} is already {state} ({where}); "
                       f"stop it or launch with --force")


async def launch_on_hosts(config: Config, profile: Profile, pool: dict[str, Host], *,
                          force: bool = False, hooks: LaunchHooks | None = None) -> Run:
    """The plain-SSH launch: detached on every one of the profile's hosts, node 0 first."""
    name = profile.name
    nodes = [host_of(pool, config, h) for h in profile.hosts]
    if len({(n.cfg.ssh, n.cfg.root) for n in nodes}) != len(nodes):
        raise ConfigError(f"[profiles.{name}] hosts: two nodes share one host and root")
    await asyncio.gather(*(n.connect() for n in nodes))
    if not force:  # early and friendly; the runner checks again, under its lock, at the start
        found = await asyncio.gather(*(host_records(n) for n in nodes))
        busy = [r for recs in found for r in recs if r.profile == name and r.status == "running"]
        if busy:
            where = ", ".join(sorted({f"{r.id} on {r.host}" for r in busy}))
            force = await start_anyway(name, busy, where, hooks)
    pushes = list(await asyncio.gather(*(push_for(config, profile, n, hooks) for n in nodes)))
    run_id = new_run_id(name)
    rdzv = await _rendezvous(profile, nodes[0]) if len(nodes) > 1 else None
    # node 0 first: of two launches racing for one profile, the one that starts there wins and
    # the other is refused before it starts anything
    first = await _start_node(profile, nodes[0], 0, run_id, rdzv, pushes[0], force)
    starts = [_start_node(profile, nodes[rank], rank, run_id, rdzv, pushes[rank], force)
              for rank in range(1, len(nodes))]
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


async def push_for(config: Config, profile: Profile, host: Host,
                   hooks: LaunchHooks | None = None) -> PushReport:
    """Push the engine and the profile's sync sets (only what changed) before a start."""
    if hooks is not None and hooks.step is not None:
        hooks.step(f"pushing to {host.name}…")
    progress = hooks.progress if hooks is not None else None
    trees = await engine_trees(host)
    for s in profile.sync:
        trees.append(await sync_tree(host, config.syncs[s]))
    report = await push(host, trees, on_progress=None if progress is None else
                        lambda done, total, sent: progress(host.name, done, total, sent))
    host.engine_pushed = True  # the push above covered the engine
    if hooks is not None and hooks.step is not None:
        hooks.step(f"starting {profile.name}…")
    return report


async def _rendezvous(profile: Profile, first: Host) -> Rendezvous:
    addr = profile.env.get("MASTER_ADDR")
    if addr is None:
        addr = _ssh_hostname(first.cfg)
        if addr is None:
            res = await first.transport.run_script("hostname -I 2>/dev/null || hostname")
            words = res.stdout.split()
            addr = words[0] if words else first.cfg.ssh or "127.0.0.1"
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
                      force: bool = False) -> dict[str, Any]:
    run_dir = posixpath.join(await runs_dir(host), run_id)
    argv, is_engine = build_argv(profile, host.cfg, run_id=run_id, node_rank=rank, rdzv=rdzv,
                                 run_dir=run_dir)
    env = {k: v for k, v in profile.env.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env.setdefault("PYTHONUNBUFFERED", "1")
    spec = {
        "id": run_id, "profile": profile.name, "host": host.name, "node_rank": rank,
        "nnodes": len(profile.hosts), "argv": argv,
        "cwd": (await host.resolve(substitute(profile.cwd, run_id, run_dir)) if profile.cwd
                else await host.root()),
        "env": env, "path_prepend": {"PYTHONPATH": await host.code_dir()},
        "stdout": "events.jsonl" if is_engine else "output.log", "stderr": "output.log",
        "engine": is_engine, "run_dir": run_dir, "push": report.record(),
        "rendezvous": f"{rdzv.host}:{rdzv.port}" if rdzv else None,
    }
    # without --force the runner refuses, under a per-profile lock held until the new run is
    # recorded, when the profile already runs there: two launches at once start one run
    args = ["start", run_dir] if force else ["start", run_dir, "--unless-running"]
    result = await runner(host, args, input=json.dumps(spec))
    return dict(result or {})


def host_of(pool: dict[str, Host], config: Config, name: str) -> Host:
    """The pool's Host for name, created on first use (the caller closes the pool)."""
    if name not in pool:
        pool[name] = Host(config.host(name))
    return pool[name]


async def close_hosts(pool: dict[str, Host]) -> None:
    await asyncio.gather(*(h.close() for h in pool.values()), return_exceptions=True)


async def stop_on(host: Host, run_id: str, grace: float) -> RunRecord:
    run_dir = posixpath.join(await runs_dir(host), run_id)
    data = await runner(host, ["stop", run_dir, str(grace)], timeout=grace + 60)
    return RunRecord.from_dict(data, host.name)
