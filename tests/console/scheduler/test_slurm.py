"""Slurm cluster hosts against a real single-machine Slurm (tests/slurm.py: munged, slurmctld,
two slurmd node names on 127.0.0.1) reached as a host through the real test sshd: submit,
pending -> running -> succeeded, stop of a running job (TERM first), a failing job, a job
cancelled while pending (by `stop` and by someone else's scancel), a 2-node gloo torchrun job,
sbatch's rejection; and the config checks (partition, account, time, nodes)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

from console.app import create_app
from console.cli import main as cli_main
from console.errors import ConfigError, ConsoleError
from console.hosts.host import Host, HostPool
from console.runs.service import launch, list_runs, stop_run
from console.scheduler import scheduler_for
from console.scheduler.registry import runner
from console.scheduler.run_record import RunRecord
from console.scheduler.slurm import Job, gres_gpus, judge, parse_sinfo, partitions
from console.settings.config import Config, HostConfig, Profile, load_config
from console.settings.slurm_options import SlurmOptions, time_problem
from console.widgets.fleet_table import FleetTable
from console.widgets.run_tables import run_row
from tests.slurm import SlurmCluster, slurm_cluster  # noqa: F401 - the fixture
from tests.sshd import SSHD

WAIT_FLAG = ("import os, sys, time\nprint('started on', os.environ.get('SLURMD_NODENAME'), "
             "flush=True)\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.05)\n"
             "print('done')\n")
ALL_REDUCE = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} sum {t.item()}", flush=True)
dist.destroy_process_group()
"""


def cluster_config(sshd: SSHD, cluster: SlurmCluster, tmp_path: Path,
                   profiles: dict[str, Profile]) -> Config:
    host = HostConfig(name="cluster", ssh=sshd.target, known_hosts=str(sshd.known_hosts),
                      identity=str(sshd.user_key), python=sys.executable,
                      root=str(tmp_path / "shared root"), scheduler="slurm",
                      slurm=SlurmOptions(partition="debug", account="eagle3", time="5",
                                         cpus_per_task=1, conf=str(cluster.conf)))
    return Config(hosts={"cluster": host}, profiles=profiles)


async def wait_status(host: Host, run_id: str, want: set[str], timeout: float = 30,
                   seen: list[str] | None = None) -> RunRecord:
    deadline = time.monotonic() + timeout
    while True:
        recs = await list_runs(host, run_id)
        if recs and seen is not None and (not seen or seen[-1] != recs[0].status):
            seen.append(recs[0].status)
        if recs and recs[0].status in want:
            return recs[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"{run_id} stuck at {recs[0].to_json() if recs else None}")
        await asyncio.sleep(0.1)


async def wait_file(path: Path, text: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in (body := path.read_text()):
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"{text!r} never appeared in {path}")


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> SlurmCluster:  # noqa: F811
    slurm_cluster.idle()
    return slurm_cluster


async def test_pending_running_succeeded(sshd: SSHD, cluster: SlurmCluster, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    flag = tmp_path / "go"
    script = tmp_path / "wait.py"
    script.write_text(WAIT_FLAG)
    cfg = cluster_config(sshd, cluster, tmp_path, {"hello": Profile(
        name="hello", hosts=["cluster"], run=f"python {script} {flag}",
        slurm=SlurmOptions(extra=("--begin=now+600",)))})
    pool = HostPool(cfg)
    seen: list[str] = []
    try:
        started = await launch(cfg, "hello", pool)
        rec = started.records[0]
        assert rec.status == "pending" and rec.job_id.isdigit(), rec.to_json()
        assert "BeginTime" in rec.reason
        seen.append(rec.status)
        with pytest.raises(ConsoleError, match="already running or queued"):
            await launch(cfg, "hello", pool)
        cluster.start_now(rec.job_id)
        box = pool["cluster"]
        await wait_status(box, started.id, {"running"}, seen=seen)
        out = await wait_file(Path(rec.run_dir) / "output.log", "started on node")
        flag.write_text("")
        rec = await wait_status(box, started.id, {"succeeded", "failed"}, seen=seen)
    finally:
        await pool.close()
    assert seen[0] == "pending" and "running" in seen and seen[-1] == "succeeded", seen
    assert rec.exit_code == 0 and rec.to_json()["node_host"] in ("node1", "node2")
    out = (Path(rec.run_dir) / "output.log").read_text()
    assert out.startswith("started on node") and out.endswith("done\n")
    job = (Path(rec.run_dir) / "job.sh").read_text()
    for line in ("#SBATCH --partition=debug", "#SBATCH --account=eagle3", "#SBATCH --time=5",
                 "#SBATCH --nodes=1", "#SBATCH --cpus-per-task=1", "#SBATCH --begin=now+600"):
        assert line in job.splitlines()
    assert (Path(rec.run_dir) / f"slurm-{rec.job_id}.out").exists()
    # the CLI shows the scheduler's facts
    cfg_file = tmp_path / "config.toml"
    cfg_file.write_text(f"""
[hosts.cluster]
ssh = "{sshd.target}"
known_hosts = "{sshd.known_hosts}"
identity = "{sshd.user_key}"
python = "{sys.executable}"
root = "{tmp_path / 'shared root'}"
scheduler = "slurm"
[hosts.cluster.slurm]
partition = "debug"
account = "eagle3"
conf = "{cluster.conf}"
""")
    assert await asyncio.to_thread(cli_main, ["--config", str(cfg_file), "runs", "cluster"]) == 0
    text = capsys.readouterr().out
    assert started.id in text and f"job {rec.job_id}" in text and "succeeded" in text


async def test_follow_from_pending_to_the_end(sshd: SSHD, cluster: SlurmCluster, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`follow` reads the shared run directory like any other: it waits through pending."""
    cfg_file = tmp_path / "config.toml"
    cfg_file.write_text(f"""
[hosts.cluster]
ssh = "{sshd.target}"
known_hosts = "{sshd.known_hosts}"
identity = "{sshd.user_key}"
python = "{sys.executable}"
root = "{tmp_path / 'shared root'}"
scheduler = "slurm"
[hosts.cluster.slurm]
partition = "debug"
account = "eagle3"
extra = ["--begin=now+600"]
conf = "{cluster.conf}"
[profiles.hi]
host = "cluster"
run = "python -c 'print(\\"hello from the cluster\\")'"
""")
    cfg = load_config(cfg_file)
    pool = HostPool(cfg)
    try:
        started = await launch(cfg, "hi", pool)
    finally:
        await pool.close()
    assert started.status == "pending"
    cluster.start_now(started.records[0].job_id)
    assert await asyncio.to_thread(cli_main, ["--config", str(cfg_file), "follow",
                                              started.id]) == 0
    out, err = capsys.readouterr()
    assert out == "hello from the cluster\n"
    assert f"-- run {started.id} succeeded, exit 0" in err


async def test_stop_running_job_terms_first(sshd: SSHD, cluster: SlurmCluster,
                                            tmp_path: Path) -> None:
    cfg = cluster_config(sshd, cluster, tmp_path, {"spin": Profile(
        name="spin", hosts=["cluster"],
        run="sh -c 'trap \"echo got TERM; exit 7\" TERM; echo up; "
            "while :; do sleep 0.05; done'")})
    pool = HostPool(cfg)
    try:
        started = await launch(cfg, "spin", pool)
        box = pool["cluster"]
        rec = await wait_status(box, started.id, {"running"})
        await wait_file(Path(started.records[0].run_dir) / "output.log", "up")
        # the login node's runner never signals a Slurm run's (compute-node) pids
        with pytest.raises(ConsoleError, match="scancel"):
            await runner(box, ["stop", rec.run_dir, "1"])
        stopped = await stop_run(cfg, started.id, pool, grace=10)
    finally:
        await pool.close()
    rec = stopped.records[0]
    assert stopped.status == "stopped", rec.to_json()
    assert "got TERM" in (Path(rec.run_dir) / "output.log").read_text()
    assert rec.exit_code == 7  # it ended on the TERM, inside the grace: no hard cancel needed


async def test_failing_job(sshd: SSHD, cluster: SlurmCluster, tmp_path: Path) -> None:
    secret = "s3cret-token-value"
    cfg = cluster_config(sshd, cluster, tmp_path, {"bad": Profile(
        name="bad", hosts=["cluster"], env={"HF_TOKEN": secret},
        run="python -c 'import os, sys; print(\"oops\", len(os.environ[\"HF_TOKEN\"])); "
            "sys.exit(3)'")})
    pool = HostPool(cfg)
    try:
        started = await launch(cfg, "bad", pool)
        rec = await wait_status(pool["cluster"], started.id, {"failed", "succeeded"})
    finally:
        await pool.close()
    assert rec.status == "failed" and rec.exit_code == 3
    # the command got the secret (through sbatch's environment), no file of ours holds it
    assert (Path(rec.run_dir) / "output.log").read_text() == f"oops {len(secret)}\n"
    for f in Path(rec.run_dir).iterdir():
        assert secret not in f.read_text(), f
    assert rec.env["HF_TOKEN"] == "***"
    assert oct(Path(rec.run_dir).stat().st_mode & 0o777) == "0o700"


async def test_cancelled_while_pending(sshd: SSHD, cluster: SlurmCluster,
                                       tmp_path: Path) -> None:
    later = SlurmOptions(extra=("--begin=now+3600",))
    cfg = cluster_config(sshd, cluster, tmp_path, {
        name: Profile(name=name, hosts=["cluster"], run="true", slurm=later)
        for name in ("ours", "theirs")})
    pool = HostPool(cfg)
    try:
        ours = await launch(cfg, "ours", pool)
        theirs = await launch(cfg, "theirs", pool)
        assert [ours.status, theirs.status] == ["pending", "pending"]
        row = run_row(ours.records[0], None, time.time())  # the runs pane's cells
        assert f"job {ours.records[0].job_id} debug" in row[0]
        assert row[1].startswith("… pending (") and "BeginTime" in row[1]
        stopped = await stop_run(cfg, ours.id, pool, grace=5)
        # cancelled behind the console's back: the scheduler's word is taken and recorded
        cluster.run("scancel", theirs.records[0].job_id)
        other = await wait_status(pool["cluster"], theirs.id, {"stopped"}, timeout=15)
    finally:
        await pool.close()
    for rec in (stopped.records[0], other):
        assert rec.status == "stopped" and rec.reason == "cancelled before it started", \
            rec.to_json()
        on_disk = json.loads((Path(rec.run_dir) / "run.json").read_text())
        assert on_disk["status"] == "stopped" and on_disk["slurm_state"] == "CANCELLED"
        assert not (Path(rec.run_dir) / "output.log").exists()  # it never ran


@pytest.mark.slow  # four torch imports (two agents, two workers) on a shared 2-core box
async def test_two_node_gloo_job(sshd: SSHD, cluster: SlurmCluster, tmp_path: Path) -> None:
    script = tmp_path / "all_reduce.py"
    script.write_text(ALL_REDUCE)
    cfg = cluster_config(sshd, cluster, tmp_path, {"two": Profile(
        name="two", hosts=["cluster"], run=f"python {script}", nodes=2,
        env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"})})
    pool = HostPool(cfg)
    try:
        started = await launch(cfg, "two", pool)
        rec = await wait_status(pool["cluster"], started.id, {"succeeded", "failed"}, timeout=120)
    finally:
        await pool.close()
    run_dir = Path(rec.run_dir)
    logs = {p.name: p.read_text() for p in run_dir.glob("output*.log")}
    assert rec.status == "succeeded", (rec.to_json(), logs)
    whole = rec.to_json()
    assert rec.nnodes == 2 and whole["nodes"][0]["status"] == "succeeded"
    assert {whole["node_host"], whole["nodes"][0]["node_host"]} == {"node1", "node2"}
    assert "of 2 sum 3.0" in logs["output.log"] and "of 2 sum 3.0" in logs["output.node-1.log"]
    argv = list(rec.argv)
    assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == "0"


async def test_sbatch_rejection_named_nothing_left(sshd: SSHD, cluster: SlurmCluster,
                                                   tmp_path: Path) -> None:
    cfg = cluster_config(sshd, cluster, tmp_path, {"nowhere": Profile(
        name="nowhere", hosts=["cluster"], run="true",
        slurm=SlurmOptions(partition="nosuch"))})
    pool = HostPool(cfg)
    try:
        with pytest.raises(ConsoleError) as e:
            await launch(cfg, "nowhere", pool)
    finally:
        await pool.close()
    msg = str(e.value)
    assert "sbatch rejected the job" in msg and "invalid partition" in msg.lower()
    assert "\n" not in msg
    assert list((tmp_path / "shared root" / "runs").iterdir()) == []


async def test_sbatch_not_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    box = HostConfig(name="login", ssh=None, python=sys.executable, root=str(tmp_path / "root"),
                     scheduler="slurm", slurm=SlurmOptions(partition="p", account="a"))
    cfg = Config(hosts={"login": box}, profiles={"p": Profile(name="p", hosts=["login"],
                                                              run="true")})
    pool = HostPool(cfg)
    try:
        with pytest.raises(ConsoleError, match="sbatch is not on PATH") as e:
            await scheduler_for(box).submit(cfg, cfg.profiles["p"], pool, force=True)
    finally:
        await pool.close()
    assert "\n" not in str(e.value)
    assert list((tmp_path / "root" / "runs").iterdir()) == []


# -- configuration ---------------------------------------------------------------------------

HOST = """
[hosts.cluster]
ssh = "me@login.example.org"
scheduler = "slurm"
root = "/shared/me/eagle3"
[hosts.cluster.slurm]
{host_slurm}
[profiles.train]
host = "cluster"
run = "engine train"
nodes = 2
[profiles.train.slurm]
{profile_slurm}
"""


def load(tmp_path: Path, host_slurm: str, profile_slurm: str = "") -> Config:
    p = tmp_path / "config.toml"
    p.write_text(HOST.format(host_slurm=host_slurm, profile_slurm=profile_slurm))
    return load_config(p)


def test_config_cluster_host_and_profile_override(tmp_path: Path) -> None:
    cfg = load(tmp_path, 'partition = "gpu"\naccount = "proj"\ntime = "1-00:00:00"\n'
                         'gpus_per_node = 8\nmem = "500G"\nextra = ["--exclusive"]',
               'partition = "gpu-long"\ntime = "2-00"\nextra = ["--constraint=h100"]')
    host, prof = cfg.hosts["cluster"], cfg.profiles["train"]
    assert host.scheduler == "slurm" and prof.nodes == 2
    opts = (host.slurm or SlurmOptions()).merged(prof.slurm)
    assert opts.sbatch_lines(prof.nodes) == [
        "#SBATCH --partition=gpu-long", "#SBATCH --account=proj", "#SBATCH --time=2-00",
        "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
        "#SBATCH --mem=500G", "#SBATCH --exclusive", "#SBATCH --constraint=h100"]


@pytest.mark.parametrize(("host_slurm", "profile_slurm", "message"), [
    ('account = "proj"', "", r"\[profiles.train\] no Slurm partition: set partition in "
                             r"\[hosts.cluster.slurm\]"),
    ('partition = "gpu"', "", r"\[profiles.train\] no Slurm account"),
    ('partition = "gpu"\naccount = "a"\ntime = "1:2:3:4"', "",
     r"\[hosts.cluster.slurm.time\] expected a Slurm time limit .*'1:2:3:4'"),
    ('partition = "gpu"\naccount = "a"', 'time = "10:75"',
     r"\[profiles.train.slurm.time\] expected a Slurm time limit \(s field 75"),
    ('partition = "gpu"\naccount = "a"\nmem = "lots"', "", r"\[hosts.cluster.slurm.mem\]"),
    ('partition = "gpu x"\naccount = "a"', "", r"\[hosts.cluster.slurm.partition\]"),
    ('partition = "gpu"\naccount = "a"\nextra = ["exclusive"]', "",
     r"\[hosts.cluster.slurm.extra\]"),
    ('partition = "gpu"\naccount = "a"\npartion = "x"', "", r"unknown key 'partion'"),
])
def test_config_bad_slurm_input(tmp_path: Path, host_slurm: str, profile_slurm: str,
                                message: str) -> None:
    with pytest.raises(ConfigError, match=message) as e:
        load(tmp_path, host_slurm, profile_slurm)
    assert str(e.value).startswith(str(tmp_path / "config.toml")) and "\n" not in str(e.value)


def test_config_nodes_needs_a_slurm_host_and_scheduler_is_checked(tmp_path: Path) -> None:
    p = tmp_path / "config.toml"
    p.write_text('[hosts.a]\nssh = "a"\n[profiles.x]\nhost = "a"\nrun = "true"\nnodes = 2\n')
    with pytest.raises(ConfigError, match=r"\[profiles.x.nodes\] expected a host with "
                                          r"scheduler = \"slurm\""):
        load_config(p)
    p.write_text('[hosts.a]\nssh = "a"\nscheduler = "pbs"\n')
    with pytest.raises(ConfigError, match=r"\[hosts.a.scheduler\] expected one of 'ssh', "
                                          r"'slurm', got 'pbs'"):
        load_config(p)


@pytest.mark.parametrize(("value", "ok"), [
    ("30", True), ("30:15", True), ("4:30:00", True), ("2-12", True), ("2-12:30", True),
    ("2-12:30:15", True), ("UNLIMITED", True), ("", False), ("1:2:3:4", False),
    ("2-25", False), ("1:60", False), ("1h", False), ("-5", False), ("2-", False)])
def test_slurm_time_formats(value: str, ok: bool) -> None:
    assert (time_problem(value) is None) is ok


def test_scheduler_truth_for_jobs_the_run_never_finished() -> None:
    """How a finished job's state reads when the record did not say how it ended."""
    def rec(status: str) -> RunRecord:
        return RunRecord.from_dict({"id": "r", "status": status, "scheduler": "slurm",
                                    "job_id": "7", "pid": 4242, "pgid": 4242}, "h")
    cases = [
        (rec("pending"), Job("7", "PENDING", "Resources", position=3),
         ("pending", "#3 Resources", False)),
        (rec("pending"), Job("7", "RUNNING"), ("running", "", False)),
        (rec("pending"), Job("7", "FAILED", "BadConstraints"),
         ("failed", "failed before start: BadConstraints", True)),
        (rec("running"), Job("7", "NODE_FAIL"), ("failed", "node failure", True)),
        (rec("running"), Job("7", "TIMEOUT"), ("failed", "time limit", True)),
        (rec("failed"), Job("7", "TIMEOUT"), ("failed", "time limit", True)),
        (rec("succeeded"), Job("7", "COMPLETED"), ("succeeded", "", True)),
        (rec("running"), None, ("lost", "Slurm no longer knows job 7", False)),
    ]
    for r, job, want in cases:
        assert judge(r, job) == want, (r.status, job)


async def test_partitions_from_sinfo(sshd: SSHD, cluster: SlurmCluster, tmp_path: Path) -> None:
    """sinfo through the login node: one line per partition; a running job takes a node's
    idleness (one CPU of two: the node is `mix`)."""
    script = tmp_path / "wait.py"
    script.write_text(WAIT_FLAG)
    flag = tmp_path / "go"
    cfg = cluster_config(sshd, cluster, tmp_path, {"w": Profile(
        name="w", hosts=["cluster"], run=f"python {script} {flag}")})
    pool = HostPool(cfg)
    try:
        box = pool["cluster"]
        assert [p.text() for p in await partitions(box)] == ["debug: 2 nodes, 2 idle · no GPUs"]
        started = await launch(cfg, "w", pool)
        await wait_status(box, started.id, {"running"})
        parts = await partitions(box)
        flag.write_text("")
        await wait_status(box, started.id, {"succeeded"})
    finally:
        await pool.close()
    assert [(p.name, p.nodes, p.idle, p.down) for p in parts] == [("debug", 2, 1, 0)]


def test_gres_gpu_counts_and_free_gpus() -> None:
    """Gres strings as sinfo prints them (Slurm's gres.conf docs), and free GPUs counted only
    on nodes that can take work."""
    assert gres_gpus("(null)") == 0
    assert gres_gpus("gpu:8") == 8
    assert gres_gpus("gpu:h100:4(S:0-1)") == 4
    assert gres_gpus("gpu:a100:2(IDX:0,2),shard:a100:4") == 2
    assert gres_gpus("gpu:a100:2,gpu:v100:1") == 3
    text = ("gpu|idle|gpu:h100:8(S:0-1)|gpu:h100:0(IDX:N/A)|n1|\n"
            "gpu|mix|gpu:h100:8(S:0-1)|gpu:h100:3(IDX:0-2)|n2|\n"
            "gpu|down*|gpu:h100:8(S:0-1)|gpu:h100:0(IDX:N/A)|n3|\n"
            "cpu|alloc|(null)|gpu:0|c1|\n")
    assert [p.text() for p in parse_sinfo(text)] == [
        "gpu: 3 nodes, 1 idle, 1 down · GPUs 13 free of 24", "cpu: 1 node, 0 idle · no GPUs"]


async def test_fleet_view_shows_partitions(sshd: SSHD, cluster: SlurmCluster,
                                           tmp_path: Path) -> None:
    cfg = cluster_config(sshd, cluster, tmp_path, {})
    app = create_app(cfg, host="cluster")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("3")
        table = app.screen.query_one(FleetTable)
        end = time.monotonic() + 30
        while not any(h.partitions for h in table.hosts):
            assert time.monotonic() < end, "no partitions shown"
            await pilot.pause(0.1)
        host = next(h for h in table.hosts if h.name == "cluster")
        assert host.partitions == ["debug: 2 nodes, 2 idle · no GPUs"]
        assert any("debug: 2 nodes" in "".join(t for t, _ in line.runs)
                   for line in table.lines())
