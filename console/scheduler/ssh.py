"""Plain SSH hosts: the run is a detached process tree on each named host, started, listed and
stopped by the host-side runner (console/hostside/runner.py; the code is in console/run_host.py)."""

from __future__ import annotations

import asyncio

from console.config import Config, Profile
from console.host import Host
from console.run_host import (
    LaunchHooks,
    Run,
    RunRecord,
    host_records,
    launch_on_hosts,
    stop_on,
)
from console.scheduler.base import Scheduler


class SshScheduler(Scheduler):
    name = "ssh"

    async def submit(self, config: Config, profile: Profile, pool: dict[str, Host], *,
                     force: bool = False, hooks: LaunchHooks | None = None) -> Run:
        return await launch_on_hosts(config, profile, pool, force=force, hooks=hooks)

    async def status(self, host: Host, run_id: str | None = None) -> list[RunRecord]:
        return await host_records(host, run_id)

    async def stop(self, host: Host, records: list[RunRecord], grace: float) -> list[RunRecord]:
        return list(await asyncio.gather(*(stop_on(host, r.id, grace) for r in records)))
