"""A run record parsed once: run.json as the host-side runner listed it, into typed fields.

The runner checks every field it acts on (console/hostside/records.py record_problem); the
console checks again here, because what a host sends is not trusted. A record with a field of
the wrong type comes back `corrupt` with the reason, and carries nothing else. Nothing on the
console side reads run.json's dict: panes, commands and schedulers use these fields, and
`to_json()` gives the record back whole for `--json` output.

`engine train` writes a run.json of its own in its --out directory (the settings, the finetune
source and the data and vocab hashes): a TrainRun, the provenance a run detail shows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from console.hostside.records import best_figure, record_problem
from console.scheduler.run_status import RunStatus


@dataclass(frozen=True)
class PushInfo:
    """What the push before a run sent: the manifest hash and, per tree, the local git commit
    of the folder pushed (`-dirty` with local changes)."""

    manifest: str = ""
    git: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, d: object) -> PushInfo:
        if not isinstance(d, dict):
            return cls()
        git = d.get("git")
        commits = {str(k): str(v) for k, v in git.items() if v} if isinstance(git, dict) else {}
        return cls(manifest=_text(d.get("manifest")), git=commits)


@dataclass(frozen=True)
class SlurmInfo:
    """A Slurm run's job: its id, partition, nodes, what the scheduler says (why it waits, or
    how it ended), the state recorded once it ended, and the other nodes' statuses."""

    job_id: str = ""
    partition: str = ""
    nodelist: str = ""
    reason: str = ""
    state: str = ""                               # slurm_state, written once the job is over
    node_statuses: tuple[RunStatus, ...] = ()    # the other nodes' records (node-R.json)

    @classmethod
    def parse(cls, d: dict[str, Any]) -> SlurmInfo:
        opts = d.get("slurm")
        from_opts = opts.get("partition") if isinstance(opts, dict) else None
        nodes = d.get("nodes")
        statuses = [RunStatus.parse(n.get("status")) for n in nodes if isinstance(n, dict)] \
            if isinstance(nodes, list) else []
        return cls(job_id=_text(d.get("job_id")),
                   partition=_text(d.get("partition") or from_opts),
                   nodelist=_text(d.get("nodelist")), reason=_text(d.get("reason")),
                   state=_text(d.get("slurm_state")),
                   node_statuses=tuple(s if s is not None else RunStatus.CORRUPT
                                       for s in statuses))


@dataclass(frozen=True)
class RunRecord:
    """One host's record of a run (run.json, with `lost` worked out by the host)."""

    id: str
    host: str
    profile: str
    status: RunStatus
    exit_code: int | None = None
    start: float | None = None
    end: float | None = None
    node_rank: int = 0
    nnodes: int = 1
    run_dir: str = ""
    error: str = ""            # why a `corrupt` record cannot be trusted
    refused: str = ""          # why `stop` signalled nothing (a `lost` run)
    stop_held: str = ""        # what a stop waited for past its grace (the command's hold)
    stop_warning: str = ""     # what the stopped command left undone (said by the command)
    failure: str = ""          # why the command could not run (run.json `error`, written by
    #                            the runner: `cannot run vllm: No such file or directory`)
    engine: bool = False       # an engine command: its stdout is events.jsonl
    argv: tuple[str, ...] = ()
    cwd: str = ""
    env: Mapping[str, str] = field(default_factory=dict)   # secrets already masked by the host
    pid: int | None = None
    push: PushInfo = field(default_factory=PushInfo)
    slurm: SlurmInfo | None = None                 # set for a run placed by Slurm
    best_tau: float | None = None  # a training run's best held-out acceptance length so far
    best_step: int | None = None   # and its step (the runner reads OUT/best/provenance.json)
    #: (start, end) of each earlier attempt of a resumed run, oldest first (run.json "attempts")
    earlier: tuple[tuple[float, float], ...] = ()
    pipeline: str = ""         # the pipeline run this record is a part of ("" for none)
    part: str = ""             # and which part: store, producer or trainer
    _source: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: Any, host: str) -> RunRecord:
        """A record as the runner listed it; one with a field of the wrong type or range (the
        runner checks too, this is the console's own guard) comes back `corrupt`."""
        if isinstance(d, dict) and d.get("status") == RunStatus.CORRUPT.value:
            problem: str | None = _text(d.get("error")) or "unreadable record"
        else:
            problem = record_problem(d)
        if problem is not None:  # keep only what can be shown safely
            src = d if isinstance(d, dict) else {}
            rid, profile, run_dir = src.get("id"), src.get("profile"), src.get("run_dir")
            safe = {"id": rid if isinstance(rid, str) and rid else "?",
                    "status": RunStatus.CORRUPT.value, "error": problem,
                    "profile": profile if isinstance(profile, str) else "",
                    "run_dir": run_dir if isinstance(run_dir, str) else ""}
            return cls(id=safe["id"], host=host, profile=safe["profile"],
                       status=RunStatus.CORRUPT, run_dir=safe["run_dir"], error=problem,
                       _source=safe)
        status = RunStatus.parse(d["status"]) or RunStatus.CORRUPT  # record_problem checked it
        env = d.get("env")
        return cls(
            id=d["id"], host=str(d.get("host") or host), profile=d.get("profile") or "",
            status=status, exit_code=d.get("exit_code"), start=d.get("start"), end=d.get("end"),
            node_rank=d.get("node_rank") or 0, nnodes=d.get("nnodes") or 1,
            run_dir=_text(d.get("run_dir")), refused=_text(d.get("refused")),
            stop_held=_text(d.get("stop_held")), stop_warning=_text(d.get("stop_warning")),
            failure=_text(d.get("error")),
            engine=bool(d.get("engine")), argv=tuple(str(a) for a in d.get("argv") or []),
            cwd=_text(d.get("cwd")),
            env={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {},
            pid=d.get("pid"), push=PushInfo.parse(d.get("push")),
            slurm=SlurmInfo.parse(d) if d.get("scheduler") == "slurm" else None,
            **_best(d.get("best")), earlier=_attempts(d.get("attempts")),
            pipeline=_text(d.get("pipeline")), part=_text(d.get("part")), _source=d)

    # -- derived ----------------------------------------------------------------------------
    def elapsed(self, now: float) -> float | None:
        """Running time: every attempt's, the last one's up to `now` while it runs."""
        end = self.end if self.end else (now if self.status == RunStatus.RUNNING else None)
        if not self.start or not end:
            return None
        return sum(b - a for a, b in self.earlier) + end - self.start

    def attempt_starts(self) -> list[float]:
        """When each attempt after the first started (the last one: this record's start)."""
        if not self.earlier:
            return []
        return [a for a, _b in self.earlier[1:]] + ([self.start] if self.start else [])

    def best_cell(self) -> str:
        """HELD-OUT as the Runs table and `runs` show it: a training run's best held-out
        acceptance length so far at its step (`3.44@150`, narrow enough for 80 columns); `-`
        for other runs."""
        if self.best_tau is None or self.best_step is None:
            return "-"
        return f"{self.best_tau:.2f}@{self.best_step}"

    @property
    def job_id(self) -> str:
        """The Slurm job id of a run on a cluster host ("" elsewhere)."""
        return self.slurm.job_id if self.slurm else ""

    @property
    def partition(self) -> str:
        """The Slurm partition a job was queued in ("" elsewhere)."""
        return self.slurm.partition if self.slurm else ""

    @property
    def reason(self) -> str:
        """What the scheduler says: why a job is pending, or how it ended ("" if nothing)."""
        return self.slurm.reason if self.slurm else ""

    @property
    def nodelist(self) -> str:
        """The nodes a Slurm job ran on ("" when not known, or not Slurm)."""
        return self.slurm.nodelist if self.slurm else ""

    # -- changes (a record is never edited in place) ----------------------------------------
    def judged(self, status: RunStatus | None = None, **slurm: Any) -> RunRecord:
        """This record with the status and Slurm fields (reason, partition, nodelist) the
        scheduler worked out."""
        job = dataclasses.replace(self.slurm or SlurmInfo(), **slurm) if slurm else self.slurm
        return dataclasses.replace(self, status=status or self.status, slurm=job)

    def to_json(self) -> dict[str, Any]:
        """The record whole, as the host wrote it, with the status and Slurm facts the console
        judged (what `runs --json` and `launch --json` print)."""
        out = dict(self._source) | {"status": self.status.value}
        if self.slurm is not None:
            out |= {"reason": self.slurm.reason, "partition": self.slurm.partition,
                    "nodelist": self.slurm.nodelist}
        return out


@dataclass(frozen=True)
class VocabRemap:
    """How a finetune's draft vocab was rebuilt: ids kept, new and dropped, the sizes before
    and after (None: not recorded as a whole number), and every number it recorded."""

    kept: int | None = None
    new: int | None = None
    dropped: int | None = None
    old_size: int | None = None
    new_size: int | None = None
    numbers: tuple[tuple[str, float], ...] = ()

    @classmethod
    def parse(cls, d: object) -> VocabRemap | None:
        if not isinstance(d, dict):
            return None
        numbers = tuple((str(k), v) for k, v in d.items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool))
        return cls(**{k: _int(d.get(k)) for k in ("kept", "new", "dropped", "old_size",
                                                   "new_size")}, numbers=numbers)


@dataclass(frozen=True)
class FinetuneSource:
    """The drafter a training run started from: its path, format, the sha256 of its (first)
    weight file ("" when none recorded) and the vocab remap, if its vocab was rebuilt."""

    path: str = "?"
    format: str = "?"
    sha256: str = ""
    remap: VocabRemap | None = None

    @classmethod
    def parse(cls, d: object) -> FinetuneSource | None:
        """None for a run trained from scratch (no finetune object)."""
        if not isinstance(d, dict):
            return None
        shas = d.get("sha256") or {}
        sha = next(iter(shas.values()), "") if isinstance(shas, dict) else shas
        return cls(path=str(d.get("path", "?")), format=str(d.get("format", "?")),
                   sha256=_text(sha), remap=VocabRemap.parse(d.get("vocab_remap")))


@dataclass(frozen=True)
class TrainRun:
    """engine train's own run.json (RUN_DIR/run.json), as far as the console shows it: the
    engine version, what it trained against and on, and where its weights and vocab came
    from ("" where it records nothing)."""

    engine: str = ""
    target: str = ""
    data: str = ""
    vocab: str = ""                 # the vocab file given (--vocab)
    rebuild_vocab: bool = False
    finetune: FinetuneSource | None = None   # None: trained from scratch
    data_sha256: str = ""
    vocab_sha256: str = ""

    @classmethod
    def parse(cls, d: object) -> TrainRun | None:
        """None when it is not a (non-empty) object: not written yet, or not a run.json."""
        if not isinstance(d, dict) or not d:
            return None
        settings = d.get("settings")
        s = settings if isinstance(settings, dict) else {}
        return cls(engine=_truthy(d.get("engine")), target=_truthy(s.get("target")),
                   data=_truthy(s.get("data")), vocab=_truthy(s.get("vocab")),
                   rebuild_vocab=bool(s.get("rebuild_vocab")),
                   finetune=FinetuneSource.parse(d.get("finetune")),
                   data_sha256=_truthy(d.get("data_sha256")),
                   vocab_sha256=_truthy(d.get("vocab_sha256")))


def _text(v: object) -> str:
    return v if isinstance(v, str) else "" if v is None else str(v)


def _truthy(v: object) -> str:
    """A value as text; "" for one that says nothing (absent, null, empty, 0, false)."""
    return str(v) if v else ""


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _attempts(d: object) -> tuple[tuple[float, float], ...]:
    """(start, end) of each earlier attempt whose two times are finite and in order."""
    out = []
    for a in d if isinstance(d, list) else []:
        start, end = (a.get("start"), a.get("end")) if isinstance(a, dict) else (None, None)
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
               for x in (start, end)) and start <= end:   # type: ignore[operator]
            out.append((float(start), float(end)))   # type: ignore[arg-type]
    return tuple(out)


def _best(d: object) -> dict[str, Any]:
    """best_tau and best_step from the runner's "best" (an acceptance length and a step in
    range: records.best_figure), else none."""
    if not isinstance(d, dict):
        return {}
    fig = best_figure(d.get("tau"), d.get("step"))
    return {} if fig is None else {"best_tau": fig["tau"], "best_step": fig["step"]}
