"""The interface every placement backend implements: plain SSH hosts (console/scheduler/ssh.py)
and Slurm clusters (console/scheduler/slurm.py); a Kubernetes or SkyPilot backend would be a
third. `console.runs.service` (launch, list, find, stop) only talks to a host through this, so the
registry, provenance, `follow` by byte offset and the runs pane stay the same for all."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from console.hosts.host import Host, HostPool
    from console.scheduler.launch import LaunchHooks
    from console.scheduler.registry import Run
    from console.scheduler.run_record import RunRecord
    from console.settings.config import Config, Profile


class Scheduler(ABC):
    """Where and how a profile's run is placed, watched and stopped."""

    name: str = ""

    @abstractmethod
    async def submit(self, config: Config, profile: Profile, pool: HostPool, *,
                     force: bool = False, hooks: LaunchHooks | None = None,
                     resume: str | None = None) -> Run:
        """Push what changed and start (or queue) the profile's run; its records as they are
        right after (`running`, or `pending` while a scheduler holds it). An active run of the
        profile is refused unless force, or hooks.confirm says to start another. resume: the
        id of an ended run of the profile to start again, in its own directory, with the
        command's `--resume` (console/runs/service.py resume_run checks the command has one)."""

    @abstractmethod
    async def status(self, host: Host, run_id: str | None = None) -> list[RunRecord]:
        """The host's run records (or run_id's), oldest first, with the backend's truth on top
        of what the records say (a lost process, a job the scheduler cancelled)."""

    @abstractmethod
    async def stop(self, host: Host, records: list[RunRecord], grace: float) -> list[RunRecord]:
        """Stop a run's records on this host: a polite signal, the hard way after grace."""

    def describe(self, rec: RunRecord) -> dict[str, str]:
        """Backend facts worth a column (job id, partition, nodes, pending reason); {} here."""
        return {}
