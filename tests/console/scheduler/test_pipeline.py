"""A pipeline profile across two hosts (two sshd on 127.0.0.1, each host its own root and its
own engine push): the store and the producer (`engine stream-put` over the demo's data) on one,
the trainer on the other, launched, followed and stopped from the console's subcommands. The
store is a real Mooncake master, started by the launch on the loopback address the store's
host is reached at, and the others reach it at the address it announced."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from console.scheduler.pipeline import fill, store_profile, stream_run
from console.settings.config import Pipeline, Profile
from tests.paths import REPO
from tests.slurm import SlurmCluster, slurm_cluster  # noqa: F401 - the fixture
from tests.sshd import SSHD, start_sshd
from tests.waiting import wait_until

pytest_plugins = ("tests.demo_workspace", "tests.stream_store")

STEPS = 3


@pytest.fixture
def second_sshd(tmp_path: Path) -> Iterator[SSHD]:
    server = start_sshd(tmp_path / "sshd2")
    yield server
    server.stop()


def host_toml(name: str, sshd: SSHD, root: Path) -> str:
    return (f'[hosts.{name}]\nssh = "{sshd.target}"\nknown_hosts = "{sshd.known_hosts}"\n'
            f'identity = "{sshd.user_key}"\npython = "{sys.executable}"\nroot = "{root}"\n')


def pipeline_config(tmp_path: Path, a: SSHD, b: SSHD, demo: Path) -> Path:
    info = json.loads((demo / "demo.json").read_text())
    train = (f"engine train --target {demo / 'target'} --from-stream {{stream}} --data "
             f"{{stream_run}} --out {{run_dir}}/out --draft-vocab-size "
             f"{info['draft_vocab_size']} --max-steps {STEPS} --holdout 4 --batch-tokens 512 "
             "--ttt-steps 2 --save-every 0")
    text = (host_toml("gpu1", a, tmp_path / "root1") + host_toml("gpu2", b, tmp_path / "root2")
            + '[profiles.pipe]\nkind = "pipeline"\nenv = { OMP_NUM_THREADS = "1" }\n'
            + '[profiles.pipe.store]\nhost = "gpu1"\n'
            + '[profiles.pipe.producer]\nhost = "gpu1"\n'
            + f'run = "engine stream-put --data {demo / "data"} --to {{stream}} '
              '--run {stream_run}"\n'
            + f'[profiles.pipe.trainer]\nhost = "gpu2"\nrun = "{train}"\n')
    # the same trainer behind a producer that never puts anything: it waits until stopped
    idle = tmp_path / "idle_producer.py"
    idle.write_text("import time\ntime.sleep(600)\n")
    text += ('[profiles.idle]\nkind = "pipeline"\n[profiles.idle.store]\nhost = "gpu1"\n'
             f'[profiles.idle.producer]\nhost = "gpu1"\nrun = "python3 {idle} {{stream}}"\n'
             f'[profiles.idle.trainer]\nhost = "gpu2"\nrun = "{train}"\n')
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def cli(config: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "console", "--config", str(config), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def registry(config: Path, host: str) -> list[dict[str, object]]:
    r = cli(config, "runs", host, "--json")
    assert r.returncode == 0, r.stderr
    return list(json.loads(r.stdout))


@pytest.mark.sshd
@pytest.mark.usefixtures("mooncake")
def test_a_pipeline_across_two_hosts_is_launched_followed_and_stopped(
        sshd: SSHD, second_sshd: SSHD, demo_dir: Path, tmp_path: Path) -> None:
    config = pipeline_config(tmp_path, sshd, second_sshd, demo_dir)
    r = cli(config, "launch", "pipe")
    assert r.returncode == 0, r.stderr
    pid = r.stdout.split()[0]
    assert pid.startswith("pipe-")
    assert [ln.split(":")[0].strip() for ln in r.stdout.splitlines()[1:]] == \
        ["gpu1 store", "gpu1 producer", "gpu2 trainer"], r.stdout

    follow = cli(config, "follow", pid)
    assert follow.returncode == 0, follow.stdout + follow.stderr
    out = follow.stdout
    assert f"step {STEPS}/{STEPS}" in out, out
    assert "[producer] stream producer: all" in out, out          # the producer's lines
    assert "[producer] stream producer: pool_samples " in out, out   # and its pool figures
    assert f"-- pipeline {pid} succeeded" in follow.stderr, follow.stderr

    runs = {str(x["id"]): x for x in registry(config, "gpu1") + registry(config, "gpu2")}
    assert {k: (v["status"], v["pipeline"], v["host"]) for k, v in runs.items()} == {
        f"{pid}.store": ("stopped", pid, "gpu1"),          # stopped once the others ended
        f"{pid}.producer": ("succeeded", pid, "gpu1"),
        f"{pid}.trainer": ("succeeded", pid, "gpu2")}
    # the store listened where gpu1 is reached, and the others were given what it announced
    store_argv = list(runs[f"{pid}.store"]["argv"])   # type: ignore[call-overload]
    assert store_argv[store_argv.index("--host") + 1] == "127.0.0.1"
    trainer_argv = list(runs[f"{pid}.trainer"]["argv"])   # type: ignore[call-overload]
    address = trainer_argv[trainer_argv.index("--from-stream") + 1]
    assert address.startswith("127.0.0.1:")
    assert trainer_argv[trainer_argv.index("--data") + 1] == pid
    assert (tmp_path / "root2" / "runs" / f"{pid}.trainer" / "out").is_dir()

    # a second one, stopped while its trainer waits for samples: every part goes
    r = cli(config, "launch", "idle")
    assert r.returncode == 0, r.stderr
    second = r.stdout.split()[0]
    stop = cli(config, "stop", second, "--grace", "5")
    assert stop.returncode == 0, stop.stderr
    said = sorted(ln.split(" on ")[0] for ln in stop.stdout.splitlines())
    assert said == [f"{second}.{p}" for p in ("producer", "store", "trainer")], stop.stdout
    runs = {str(x["id"]): x for x in registry(config, "gpu1") + registry(config, "gpu2")}
    assert {runs[f"{second}.{p}"]["status"] for p in ("store", "producer", "trainer")} == \
        {"stopped"}


def test_a_parts_run_string_gets_the_stores_address_and_the_stream_runs_name() -> None:
    part = Profile(name="p.trainer", hosts=["b"], run="engine train --from-stream {stream} "
                   "--data {stream_run} --out {run_dir}/out --note '{other}'")
    got = fill(part, "p", "10.0.0.1:5000/5001", "p-20261206-100000-abcd")
    assert got.name == "p"   # recorded under the pipeline's name: one lock, one profile
    assert got.run == ("engine train --from-stream 10.0.0.1:5000/5001 --data "
                       "p-20261206-100000-abcd --out {run_dir}/out --note '{other}'")
    store = store_profile(Profile(name="p", hosts=["a"], run="", sync=["s"]),
                          Pipeline(store_host="a", producer=part, trainer=part,
                                   store_env={"X": "1"}), "10.0.0.1")
    assert (store.hosts, store.env, store.sync) == (["a"], {"X": "1"}, ["s"])
    assert store.run == ("engine stream-master --host 10.0.0.1 --address-file "
                         "{run_dir}/store.addr")


def test_a_stream_runs_name_fits_the_engines_rule() -> None:
    assert stream_run("p-20261206-100000-abcd") == "p-20261206-100000-abcd"
    long = "x" * 70 + "-20261206-100000-abcd"
    assert len(stream_run(long)) == 64 and stream_run(long).endswith("-abcd")
    assert stream_run("_" * 60 + "-20261206-100000-abcd")[0].isalnum()


@pytest.mark.sshd
@pytest.mark.usefixtures("mooncake")
def test_a_part_that_cannot_start_takes_the_parts_before_it_down(sshd: SSHD,
                                                                 tmp_path: Path) -> None:
    """A producer that is not there: the store it met is stopped, no trainer starts, and the
    launch fails with one line naming why; a store that cannot listen where it is told: the
    launch says so with the engine's words, before any other part starts."""
    text = (host_toml("gpu1", sshd, tmp_path / "root")
            + '[profiles.pipe]\nkind = "pipeline"\n[profiles.pipe.store]\nhost = "gpu1"\n'
            + '[profiles.pipe.producer]\nhost = "gpu1"\nrun = "no-such-program-xyz {stream}"\n'
            + '[profiles.pipe.trainer]\nhost = "gpu1"\nrun = "engine train --from-stream '
              '{stream} --data {stream_run}"\n')
    config = tmp_path / "config.toml"
    config.write_text(text)
    r = cli(config, "launch", "pipe")
    assert r.returncode == 1 and "cannot run no-such-program-xyz" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    runs = {str(x["part"]): str(x["status"]) for x in registry(config, "gpu1")}
    assert runs == {"store": "stopped", "producer": "failed"}   # and no trainer

    config.write_text(text.replace('host = "gpu1"\n[profiles.pipe.producer]',
                                   'host = "gpu1"\naddress = "no-such-host.invalid"\n'
                                   '[profiles.pipe.producer]'))
    r = cli(config, "launch", "pipe")
    assert r.returncode == 1 and "the pipeline's store on gpu1 failed: " in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    parts = sorted((str(x["part"]), str(x["status"])) for x in registry(config, "gpu1"))
    assert parts == [("producer", "failed"), ("store", "failed"), ("store", "stopped")]


@pytest.mark.sshd
@pytest.mark.usefixtures("mooncake")
def test_a_store_left_waiting_is_stopped_by_the_next_launch(sshd: SSHD, tmp_path: Path) -> None:
    """A pipeline nobody followed to its end: its producer and trainer are done, its store
    still waits. The next launch of the profile stops that store (by PID and start time) and
    starts, where it would otherwise be refused as already running."""
    done = "python -c 'import sys' {stream}"
    config = tmp_path / "config.toml"
    config.write_text(host_toml("gpu1", sshd, tmp_path / "root")
                      + '[profiles.pipe]\nkind = "pipeline"\n[profiles.pipe.store]\n'
                        'host = "gpu1"\n'
                      + f'[profiles.pipe.producer]\nhost = "gpu1"\nrun = "{done}"\n'
                      + f'[profiles.pipe.trainer]\nhost = "gpu1"\nrun = "{done}"\n')
    first = cli(config, "launch", "pipe")
    assert first.returncode == 0, first.stderr
    pid = first.stdout.split()[0]

    def parts(of: str) -> dict[str, str]:
        return {str(x["part"]): str(x["status"]) for x in registry(config, "gpu1")
                if x["pipeline"] == of}
    wait_until(lambda: parts(pid) == {"store": "running", "producer": "succeeded",
                                      "trainer": "succeeded"}, timeout=60,
               what="the producer and the trainer to end")
    second = cli(config, "launch", "pipe")
    assert second.returncode == 0, second.stderr
    assert parts(pid)["store"] == "stopped"
    again = second.stdout.split()[0]
    assert cli(config, "stop", again, "--grace", "5").returncode == 0
    assert set(parts(again).values()) <= {"stopped", "succeeded"}


def slurm_host_toml(name: str, sshd: SSHD, root: Path, cluster: SlurmCluster) -> str:
    return (host_toml(name, sshd, root) + 'scheduler = "slurm"\n'
            f'[hosts.{name}.slurm]\npartition = "debug"\naccount = "eagle3"\ntime = "5"\n'
            f'conf = "{cluster.conf}"\n')


@pytest.mark.sshd
@pytest.mark.usefixtures("mooncake")
def test_a_pipelines_trainer_on_a_slurm_host_is_a_job_followed_and_cancelled(
        sshd: SSHD, slurm_cluster: SlurmCluster, demo_dir: Path,  # noqa: F811
        tmp_path: Path) -> None:
    """The store and the producer on an SSH host, the trainer a batch job on the test Slurm
    (its login node reached through the same sshd, its own root): the job trains from the
    stream and `follow` follows it from pending (its [P.trainer.slurm] table holds it back
    until the test has seen the launch say so) to its end; a second pipeline's job, waiting
    for samples, is cancelled by `stop` with the other parts."""
    slurm_cluster.idle()
    config = pipeline_config(tmp_path, sshd, sshd, demo_dir)
    text = config.read_text().replace(host_toml("gpu2", sshd, tmp_path / "root2"), "")
    assert "\n[profiles.idle]" in text
    text = text.replace("\n[profiles.idle]", '\n[profiles.pipe.trainer.slurm]\nextra = '
                        '["--begin=now+600"]\n[profiles.idle]')
    config.write_text(slurm_host_toml("cluster", sshd, tmp_path / "shared", slurm_cluster)
                      + text.replace('host = "gpu2"', 'host = "cluster"'))
    r = cli(config, "launch", "pipe")
    assert r.returncode == 0, r.stderr
    said = {ln.split(":")[0].strip(): ln for ln in r.stdout.splitlines()[1:]}
    assert list(said) == ["gpu1 store", "gpu1 producer", "cluster trainer"], r.stdout
    assert " pending " in said["cluster trainer"], r.stdout
    pid = r.stdout.split()[0]
    job_id = said["cluster trainer"].split(" job ")[1].split()[0]
    slurm_cluster.start_now(job_id)
    follow = cli(config, "follow", pid)
    assert follow.returncode == 0, follow.stdout + follow.stderr
    assert f"step {STEPS}/{STEPS}" in follow.stdout, follow.stdout
    assert f"-- pipeline {pid} succeeded" in follow.stderr, follow.stderr
    trainer = {str(x["id"]): x for x in registry(config, "cluster")}[f"{pid}.trainer"]
    assert (trainer["status"], trainer["pipeline"], trainer["part"]) == \
        ("succeeded", pid, "trainer")
    assert str(trainer["job_id"]).isdigit() and trainer["node_host"] in ("node1", "node2")
    argv = list(trainer["argv"])   # type: ignore[call-overload]
    assert argv[argv.index("--from-stream") + 1].startswith("127.0.0.1:")
    job = (tmp_path / "shared" / "runs" / f"{pid}.trainer" / "job.sh").read_text()
    assert {"#SBATCH --partition=debug", "#SBATCH --begin=now+600"} <= set(job.splitlines())
    stores = {str(x["id"]): x["status"] for x in registry(config, "gpu1")}
    assert stores[f"{pid}.store"] == "stopped"

    r = cli(config, "launch", "idle")
    assert r.returncode == 0, r.stderr
    second = r.stdout.split()[0]

    def job_state() -> str:
        rec = {str(x["id"]): x for x in registry(config, "cluster")}[f"{second}.trainer"]
        return str(rec["status"])
    wait_until(lambda: job_state() == "running", timeout=30, what="the trainer's job to run")
    stop = cli(config, "stop", second, "--grace", "5")
    assert stop.returncode == 0, stop.stderr
    rec = {str(x["id"]): x for x in registry(config, "cluster")}[f"{second}.trainer"]
    assert rec["status"] == "stopped", rec
    queue = slurm_cluster.run("squeue", "-h", "-o", "%i").stdout.split()
    assert str(rec["job_id"]) not in queue
    runs = {str(x["id"]): x["status"] for x in registry(config, "gpu1")}
    assert runs[f"{second}.store"] == runs[f"{second}.producer"] == "stopped"


@pytest.mark.sshd
@pytest.mark.usefixtures("mooncake")
def test_a_trainer_job_sbatch_rejects_takes_the_store_and_producer_down(
        sshd: SSHD, slurm_cluster: SlurmCluster, tmp_path: Path) -> None:  # noqa: F811
    """A trainer's job sbatch refuses (a partition the cluster does not have): the launch
    fails with sbatch's words on one line, the store and the producer it had started are
    stopped, and no trainer record is left on the cluster."""
    slurm_cluster.idle()
    idle = tmp_path / "idle_producer.py"
    idle.write_text("import time\ntime.sleep(600)\n")
    config = tmp_path / "config.toml"
    config.write_text(host_toml("gpu1", sshd, tmp_path / "root")
                      + slurm_host_toml("cluster", sshd, tmp_path / "shared", slurm_cluster)
                      + '[profiles.pipe]\nkind = "pipeline"\n[profiles.pipe.store]\n'
                        'host = "gpu1"\n'
                      + f'[profiles.pipe.producer]\nhost = "gpu1"\nrun = "python3 {idle} '
                        '{stream}"\n'
                      + '[profiles.pipe.trainer]\nhost = "cluster"\nrun = "python3 -c pass '
                        '{stream}"\n[profiles.pipe.trainer.slurm]\npartition = "nosuch"\n')
    r = cli(config, "launch", "pipe")
    assert r.returncode == 1 and "sbatch rejected the job" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    parts = {str(x["part"]): str(x["status"]) for x in registry(config, "gpu1")}
    assert parts == {"store": "stopped", "producer": "stopped"}
    assert registry(config, "cluster") == []
