"""Launch-to-first-event on the test Slurm cluster against the plain-SSH host, same machine.

    python benchmarks/slurm_launch.py DEMO_WORKSPACE [REPEATS]

DEMO_WORKSPACE: `python -m engine demo init DIR` (a tiny target and data). Each repeat launches
the demo's `scratch` training profile (a few steps) through the test sshd once on a plain host
and once on the Slurm host (tests/slurm.py's cluster), and times from the call to `launch`
to the first line of events.jsonl and to the first training `metric` event. Not a test: run
by hand (it needs slurm-wlm and munge, and takes a minute or two)."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from console.demo.config import demo_profiles
from console.hosts.host import HostPool
from console.runs.service import launch, list_runs
from console.settings.config import Config, HostConfig
from console.settings.slurm_options import SlurmOptions
from tests.slurm import start_cluster  # noqa: E402
from tests.sshd import start_sshd  # noqa: E402


async def one(cfg: Config, profile: str) -> tuple[float, float, float]:
    pool = HostPool(cfg)
    t0 = time.monotonic()
    try:
        run = await launch(cfg, profile, pool)
        t_launched = time.monotonic() - t0
        events = Path(run.records[0].run_dir) / "events.jsonl"
        first = metric = None
        while metric is None and time.monotonic() - t0 < 300:
            lines = events.read_text().splitlines() if events.exists() else []
            if lines and first is None:
                first = time.monotonic() - t0
            if any(json.loads(x).get("kind") == "metric" for x in lines if x.startswith("{")):
                metric = time.monotonic() - t0
            await asyncio.sleep(0.02)
        host = await pool.ensure(cfg.profiles[profile].hosts[0])
        while (await list_runs(host, run.id))[0].status in ("pending", "running"):
            await asyncio.sleep(0.2)
    finally:
        await pool.close()
    return t_launched, first or float("nan"), metric or float("nan")


async def main(workspace: str, repeats: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    sshd = start_sshd(tmp / "sshd")
    cluster = start_cluster(tmp / "slurm")
    try:
        def host(name: str, **kw: object) -> HostConfig:
            return HostConfig(name=name, ssh=sshd.target, known_hosts=str(sshd.known_hosts),
                              identity=str(sshd.user_key), python=sys.executable,
                              root=str(tmp / f"root-{name}"), **kw)  # type: ignore[arg-type]
        hosts = {"plain": host("plain"),
                 "cluster": host("cluster", scheduler="slurm", slurm=SlurmOptions(
                     partition="debug", account="bench", conf=str(cluster.conf)))}
        profiles = {}
        for h in hosts:
            p = demo_profiles(workspace, host=h, steps=4)["scratch"]
            profiles[f"scratch-{h}"] = replace(p, name=f"scratch-{h}")
        cfg = Config(hosts=hosts, profiles=profiles)
        results: dict[str, list[tuple[float, float, float]]] = {h: [] for h in hosts}
        for _ in range(repeats):
            for h in hosts:
                results[h].append(await one(cfg, f"scratch-{h}"))
        for h, rs in results.items():
            cols = list(zip(*rs, strict=True))
            print(f"{h:8} launch returned {statistics.median(cols[0]):5.2f} s, first event "
                  f"{statistics.median(cols[1]):5.2f} s, first metric "
                  f"{statistics.median(cols[2]):5.2f} s (median of {len(rs)}; "
                  f"first-event runs: {', '.join(f'{x:.2f}' for x in cols[1])})")
    finally:
        cluster.stop()
        sshd.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workspace", help="a demo workspace (python -m engine demo init DIR)")
    ap.add_argument("repeats", nargs="?", type=int, default=3, help="launches per host kind")
    args = ap.parse_args()
    if not (Path(args.workspace) / "target").is_dir():
        ap.error(f"{args.workspace}: not a demo workspace (no target/ in it)")
    asyncio.run(main(args.workspace, args.repeats))
