"""A host's run registry, shared by both schedulers, as the host-side runner lists it.

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
`corrupt` with the reason (RunRecord.error); the others list normally. `stop` signals a run's
process group only while its leader is the recorded command (pid and start time); otherwise
the run comes back `lost` with RunRecord.refused and nothing is signalled. Launches of one
profile on a host are serialised by ROOT/.launch-<profile>.lock (the runner's "already
running" check and the recorded start happen under it); node 0 starts first. A record is
parsed once (console/scheduler/run_record.py); its status is a RunStatus (run_status.py).
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
from console.scheduler.run_record import RunRecord
from console.scheduler.run_status import RunStatus, combined_status

RUNNER = "runner.py"   # in ROOT/code/eagle3_hostside, run as a script (see runner())


@dataclass
class Run:
    """A launched run: its id, one record per node, and what each node's push sent."""

    id: str
    records: list[RunRecord]
    pushes: list[PushReport] = field(default_factory=list)

    @property
    def status(self) -> RunStatus:
        return combined_status([r.status for r in self.records])


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
    except (ValueError, RecursionError):  # a host's answer nested past the stack is not ours
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
    """Forget the host's ended runs (console/hostside/records.py prune_runs): only the
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
