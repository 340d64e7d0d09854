"""Run records shared by both schedulers: a host's registry as the host-side runner lists it.

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
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from console.errors import CommandFailed, ConsoleError
from console.hosts.engine_client import ensure_engine
from console.hosts.host import Host
from console.hosts.push import HOSTSIDE_PACKAGE, PushReport
from console.hostside.runner import record_problem

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


@dataclass
class PruneReport:
    """What `prune` did on one host: the runs forgotten, those kept (with why), and the
    directories left for files the console did not write in them."""

    host: str
    removed: list[str]
    kept: list[tuple[str, str]]                  # (run id, why: running, queued, corrupt ...)
    left: list[tuple[str, list[str]]]            # (run id, names left in its directory)


async def host_prune(host: Host) -> PruneReport:
    """Forget the host's ended runs (console/hostside/run_records.py prune_runs): only the
    files the runner wrote are deleted; nothing is signalled."""
    data = await runner(host, ["prune", await runs_dir(host)])
    if not isinstance(data, dict):
        raise ConsoleError(f"{host.name}: the runner's prune answered {data!r}")
    kept = [(str(k.get("id")), str(k.get("why"))) for k in data.get("kept") or []]
    left = [(str(x.get("id")), [str(n) for n in x.get("files") or []])
            for x in data.get("left") or []]
    return PruneReport(host.name, [str(r) for r in data.get("removed") or []], kept, left)


def newest_first(records: Sequence[RunRecord]) -> list[RunRecord]:
    """The one order runs are shown in (the runs pane, `runs HOST`): latest start first."""
    return sorted(records, key=lambda r: (r.start or 0.0, r.id), reverse=True)
