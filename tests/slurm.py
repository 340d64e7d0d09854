"""A real single-machine Slurm for tests: munged, slurmctld and two slurmd (node names node1
and node2, both on 127.0.0.1 with their own ports and spool directories; proctrack/linuxproc,
no cgroups, no accounting database), all with files under one temporary folder. Debian's
slurm-wlm runs two slurmd on one machine with `slurmd -N NODENAME` and a per-node `Port=`."""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "srun", "sinfo")
NODES = ("node1", "node2")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find(name: str) -> str | None:
    for cand in (shutil.which(name), f"/usr/sbin/{name}", f"/usr/bin/{name}"):
        if cand and os.path.exists(cand):
            return cand
    return None


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if find(b) is None]


@dataclass
class SlurmCluster:
    """A running test cluster; `env` makes the Slurm commands talk to it."""

    dir: Path
    conf: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                              timeout=30, check=check)

    def node_states(self) -> dict[str, str]:
        res = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        return dict(line.split(None, 1) for line in res.stdout.splitlines() if " " in line)

    def idle(self, timeout: float = 20) -> None:
        """Wait until no job of ours is left and both nodes are idle (between tests)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            queue = self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
            states = self.node_states()
            if not queue and states and all(s == "idle" for s in states.values()):
                return
            time.sleep(0.1)
        raise RuntimeError(f"cluster not idle: {self.node_states()} "
                           f"{self.run('squeue', check=False).stdout}")

    def start_now(self, job_id: str) -> None:
        """Let a job held back with `--begin=now+600` start: a test that must see it pending
        holds it for longer than any slow machine takes, then lets it go."""
        self.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")

    def log(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted((self.dir / "log").glob("*")))

    def stop(self) -> None:
        self.run("scancel", "-u", getpass.getuser(), check=False)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.run("squeue", "-h", check=False).stdout:
            time.sleep(0.1)
        for p in reversed(self.procs):  # slurmd, slurmctld, then munged: the ones we started
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def start_cluster(dir: Path) -> SlurmCluster:
    dir.mkdir(parents=True, exist_ok=True)
    os.chmod(dir, 0o700)
    for sub in ("munge", "state", "log", *(f"spool-{n}" for n in NODES)):
        (dir / sub).mkdir(mode=0o700, exist_ok=True)
    key = dir / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    sock = dir / "munge" / "sock"
    user = getpass.getuser()
    ctld, slurmd = free_port(), free_port()
    node_ports = {n: free_port() for n in NODES}
    conf = dir / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=eagle3test", "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={ctld}", f"SlurmdPort={slurmd}",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={sock}",
        f"SlurmUser={user}", f"SlurmdUser={user}",
        f"StateSaveLocation={dir / 'state'}", f"SlurmdSpoolDir={dir}/spool-%n",
        f"SlurmctldPidFile={dir}/slurmctld.pid", f"SlurmdPidFile={dir}/slurmd-%n.pid",
        f"SlurmctldLogFile={dir}/log/slurmctld.log", f"SlurmdLogFile={dir}/log/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SchedulerType=sched/backfill", "SchedulerParameters=sched_interval=1",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "MpiDefault=none",
        "ReturnToService=2", "MinJobAge=300", "KillWait=2", "InactiveLimit=0",
        "MessageTimeout=10",
        *(f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={p} CPUs=2 "
          f"RealMemory=1000 State=UNKNOWN" for n, p in node_ports.items()),
        f"PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP",
        ""]))
    cluster = SlurmCluster(dir=dir, conf=conf)
    env = cluster.env
    log = open(dir / "log" / "daemons.out", "wb")  # noqa: SIM115
    try:
        cluster.procs.append(subprocess.Popen(
            [find("munged") or "munged", "-F", "-f", f"--key-file={key}", f"--socket={sock}",
             f"--pid-file={dir}/munge/pid", f"--seed-file={dir}/munge/seed",
             f"--log-file={dir}/log/munged.log"], stdout=log, stderr=log))
        _wait(lambda: sock.exists(), "munged did not create its socket", cluster)
        cluster.procs.append(subprocess.Popen(
            [find("slurmctld") or "slurmctld", "-D", "-i", "-f", str(conf)], env=env,
            stdout=log, stderr=log))
        for n in NODES:
            cluster.procs.append(subprocess.Popen(
                [find("slurmd") or "slurmd", "-D", "-f", str(conf), "-N", n], env=env,
                stdout=log, stderr=log))
        _wait(lambda: sorted(cluster.node_states().values()) == ["idle", "idle"],
              "the two nodes did not come up idle", cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait(ok: object, what: str, cluster: SlurmCluster, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [p.args[0] for p in cluster.procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{what}: {dead} exited\n{cluster.log()}")
        if ok():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} within {timeout:.0f} s\n{cluster.log()}")


# -- the pytest fixture (imported by the test modules that use it) -------------------------------

try:
    import pytest
except ImportError:  # pragma: no cover - only pytest imports this module
    pytest = None  # type: ignore[assignment]

if pytest is not None:
    from collections.abc import Iterator

    @pytest.fixture(scope="session")
    def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
        """The test cluster, started once per session; skips (naming what is missing) when
        Slurm or munge are not installed, unless EAGLE3_REQUIRE_SLURM is set."""
        absent = missing_binaries()
        if absent:
            why = (f"Slurm test cluster needs {', '.join(absent)} "
                   f"(apt-get install slurm-wlm munge)")
            if os.environ.get("EAGLE3_REQUIRE_SLURM"):
                pytest.fail(f"EAGLE3_REQUIRE_SLURM is set but: {why}")
            pytest.skip(why)
        cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
        yield cluster
        cluster.stop()
