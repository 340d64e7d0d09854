"""A pipeline's status from its parts' records (PipelineRun, console/scheduler/pipeline.py):
running while its producer or its trainer runs, then their outcome (its store's own stop is
none, unless it failed), and a store left running after both ended is what `settle` stops;
which ids name a pipeline (console/runs/pipeline.py); a pipeline's row names its trainer's Slurm
job and why it waits."""

from __future__ import annotations

import pytest

from console.runs.pipeline import pipeline_profile
from console.scheduler.pipeline import PipelineRun, pipelines
from console.scheduler.run_record import RunRecord, SlurmInfo
from console.scheduler.run_status import RunStatus
from console.settings.config import Config, HostConfig, Pipeline, Profile
from console.widgets.run_tables import pipeline_row

PID = "pipe-20261206-100000-abcd"
R, S, F, X = RunStatus.RUNNING, RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.STOPPED


def rec(part: str, status: RunStatus, node: int = 0) -> RunRecord:
    return RunRecord(id=f"{PID}.{part}", host="h", profile="pipe", status=status,
                     node_rank=node, start=100.0, end=None if status.active else 200.0,
                     pipeline=PID, part=part)


@pytest.mark.parametrize("store, producer, trainer, status, lingering", [
    (R, R, R, R, False),
    (R, S, R, R, False),           # the trainer still takes the last samples
    (R, S, S, S, True),            # done: the store would wait for ever
    (X, S, S, S, False),           # its store stopped by us: not the outcome
    (X, S, F, F, False),
    (F, F, F, F, False),
    (RunStatus.LOST, S, S, RunStatus.LOST, False),   # a store that went: worth saying
    (X, F, None, F, False),        # the launch failed before the trainer started
])
def test_status_of_a_pipeline(store: RunStatus, producer: RunStatus, trainer: RunStatus | None,
                              status: RunStatus, lingering: bool) -> None:
    recs = [rec("store", store), rec("producer", producer)]
    recs += [rec("trainer", trainer)] if trainer else []
    pipe = PipelineRun(PID, tuple(recs))
    assert pipe.status == status
    assert [r.part for r in pipe.lingering] == (["store"] if lingering else [])


def test_a_multi_node_trainer_is_one_part() -> None:
    recs = [rec("store", R), rec("producer", S), rec("trainer", R, 1), rec("trainer", S, 0)]
    pipe = pipelines([*recs, RunRecord(id="other", host="h", profile="x", status=R)])[PID]
    assert [r.node_rank for r in pipe.part("trainer")] == [0, 1]
    assert pipe.part_status("trainer") == R and pipe.status == R


def test_which_ids_name_a_pipeline() -> None:
    part = Profile(name="pipe.trainer", hosts=["local"], run="x {stream}")
    cfg = Config(hosts={"local": HostConfig(name="local")}, profiles={
        "pipe": Profile(name="pipe", hosts=["local"], run="", pipeline=Pipeline(
            store_host="local", producer=part, trainer=part)),
        "plain": Profile(name="plain", hosts=["local"], run="x")})
    assert pipeline_profile(cfg, PID) is cfg.profiles["pipe"]
    assert pipeline_profile(cfg, f"{PID}.trainer") is None      # a part: a run of its own
    assert pipeline_profile(cfg, "plain-20261206-100000-abcd") is None


def test_a_pipelines_row_names_its_trainer_job_and_why_it_waits() -> None:
    """A trainer that is a Slurm job: the row's RUN cell carries the job (as a plain Slurm
    run's does) and the status says why the job waits; once it runs the reason goes."""
    job = SlurmInfo(job_id="4242", partition="gpu", reason="Priority")
    waiting = RunRecord(id=f"{PID}.trainer", host="h", profile="pipe", status=RunStatus.PENDING,
                        start=100.0, pipeline=PID, part="trainer", slurm=job)
    row = pipeline_row(PipelineRun(PID, (rec("store", R), rec("producer", R), waiting)), None,
                       160.0)
    assert row[0].endswith(" · job 4242 gpu") and row[0].startswith("pipe-")
    assert row[1].endswith(") Priority") and "trainer" in row[1]
    running = RunRecord(id=f"{PID}.trainer", host="h", profile="pipe", status=R, start=100.0,
                        pipeline=PID, part="trainer", slurm=job)
    row = pipeline_row(PipelineRun(PID, (rec("store", R), rec("producer", R), running)), None,
                       160.0)
    assert "Priority" not in row[1] and row[0].endswith(" · job 4242 gpu")
