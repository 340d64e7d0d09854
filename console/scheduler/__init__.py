"""Where a run is placed: straight on SSH hosts (`ssh`) or through a cluster's scheduler
(`slurm`). Each backend implements `console.scheduler.base.Scheduler`; `console.runs.service` picks
one per host with `scheduler_for` (imports are lazy: console.settings.config imports the options
module)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from console.scheduler.base import Scheduler
    from console.settings.config import HostConfig


def scheduler_for(cfg: HostConfig) -> Scheduler:
    """The backend that places runs on this host."""
    if cfg.scheduler == "slurm":
        from console.scheduler.slurm import SlurmScheduler
        return SlurmScheduler()
    from console.scheduler.ssh import SshScheduler
    return SshScheduler()
