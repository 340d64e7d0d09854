"""Config loading: the documented shape parses; every error names the file, key or line."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.errors import ConfigError
from console.settings.config import LOCAL, default_config, load_config

GOOD = """
theme = "nord"
[hosts.gpu1]
ssh = "gpu1"
python = "/root/venv/bin/python"
root = "/root/eagle3"
logs = ["/root/vllm.log"]
[hosts.gpu2]
ssh = "root@gpu2.example:2222"
[sync.train-scripts]
host = "gpu1"
local = "~/work/eagle3-train"
remote = "/root/eagle3-train"
exclude = ["__pycache__/", "*.pyc"]
[profiles.finetune]
host = "gpu1"
run = "engine train --target /data/kimi --data /data/eagle3 --finetune-from /data/aq-medai"
nproc_per_node = 8
sync = ["train-scripts"]
env = { NCCL_DEBUG = "WARN" }
[profiles.multi]
hosts = ["gpu1", "gpu2"]
run = "python train.py"
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "config.toml"
    p.write_text(text)
    return p


def test_documented_shape(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, GOOD))
    assert cfg.theme == "nord"
    assert cfg.hosts["gpu1"].python == "/root/venv/bin/python"
    assert cfg.hosts["gpu1"].logs == ["/root/vllm.log"]
    assert LOCAL in cfg.hosts and cfg.hosts[LOCAL].is_local
    assert cfg.syncs["train-scripts"].exclude == ["__pycache__/", "*.pyc"]
    p = cfg.profile("finetune")
    assert p.hosts == ["gpu1"] and p.nproc_per_node == 8 and p.env == {"NCCL_DEBUG": "WARN"}
    assert cfg.profile("multi").hosts == ["gpu1", "gpu2"]


def test_no_file_gives_local_default() -> None:
    cfg = load_config()
    assert list(cfg.hosts) == [LOCAL] and cfg.path is None
    assert default_config().hosts[LOCAL].ssh is None


@pytest.mark.parametrize("text, needle", [
    ("[hosts.a]\nssh = 5\n", "[hosts.a.ssh] expected a non-empty string"),
    ("[hosts.a]\nsssh = 'x'\n", "unknown key 'sssh'"),
    ("[profiles.p]\nhost = 'nope'\nrun = 'x'\n", "[profiles.p.host] expected a configured host"),
    ("[profiles.p]\nhost = 'local'\n", "[profiles.p.run] expected a string (required)"),
    ("[profiles.p]\nhost = 'local'\nrun = 'x'\nnproc_per_node = 0\n",
     "[profiles.p.nproc_per_node]"),
    ("[profiles.p]\nhost = 'local'\nrun = 'x'\nsync = ['s']\n", "[profiles.p.sync]"),
    ("[sync.s]\nhost = 'local'\nlocal = 'a'\n", "[sync.s.remote] expected a string (required)"),
    ("hosts = 3\n", "[hosts] expected a table of tables"),
    ("[hosts.a]\nssh = 'x'\nlogs = [1]\n", "[hosts.a.logs] expected a list of strings"),
])
def test_errors_name_file_and_key(tmp_path: Path, text: str, needle: str) -> None:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    msg = str(ei.value)
    assert str(p) in msg and needle in msg and "\n" not in msg


def test_toml_syntax_error_names_line(tmp_path: Path) -> None:
    p = write(tmp_path, "[hosts.a]\nssh = 'x'\nroot = \n")
    with pytest.raises(ConfigError, match=r"line 3"):
        load_config(p)


def test_explicit_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "absent.toml")


TRAIN = "[profiles.p]\nhost = 'local'\nrun = 'engine train --data /d --out {run_dir}/out'\n"


def test_a_profile_names_its_serving_vllm(tmp_path: Path) -> None:
    """`eval_server` in a train profile: the run's `engine train` gets `--eval-server URL`."""
    from console.scheduler.launch import build_argv
    cfg = load_config(write(tmp_path, TRAIN + "eval_server = 'http://127.0.0.1:8000/'\n"))
    p = cfg.profile("p")
    assert p.eval_server == "http://127.0.0.1:8000"
    argv, is_engine = build_argv(p, cfg.host(LOCAL), run_id="r1", run_dir="/runs/r1")
    assert is_engine and argv[2:] == ["engine", "train", "--data", "/d", "--out", "/runs/r1/out",
                                      "--eval-server", "http://127.0.0.1:8000", "--events"]


@pytest.mark.parametrize("extra, needle", [
    ("eval_server = 'http://10.1.2.3:8000'\n", "the base URL of a vLLM on the host's loopback"),
    ("eval_server = 'http://127.0.0.1:8000/metrics'\n", "the base URL of a vLLM"),
    ("eval_server = 'https://127.0.0.1:8000'\n", "expected an http:// URL"),
    ("eval_server = 8000\n", "expected a non-empty string"),
])
def test_a_bad_eval_server_is_refused_by_name(tmp_path: Path, extra: str, needle: str) -> None:
    with pytest.raises(ConfigError) as ei:
        load_config(write(tmp_path, TRAIN + extra))
    assert "[profiles.p.eval_server]" in str(ei.value) and needle in str(ei.value)


def test_eval_server_only_for_a_train_run(tmp_path: Path) -> None:
    text = "[profiles.p]\nhost = 'local'\nrun = 'python3 x.py'\n" \
           "eval_server = 'http://127.0.0.1:8000'\n"
    with pytest.raises(ConfigError, match=r"\[profiles.p.eval_server\] expected a profile whose "
                                          r"run is `engine train"):
        load_config(write(tmp_path, text))


PIPELINE = """
[hosts.gpu1]
ssh = "gpu1"
[hosts.gpu2]
ssh = "root@gpu2.example"
[sync.s]
host = "gpu2"
local = "a"
remote = "/srv/a"
[profiles.stream]
kind = "pipeline"
env = { OMP_NUM_THREADS = "4" }
[profiles.stream.store]
host = "gpu1"
address = "10.0.0.1"
[profiles.stream.producer]
host = "gpu1"
run = "engine stream-put --data /d --to {stream} --run {stream_run}"
[profiles.stream.trainer]
hosts = ["gpu2"]
run = "engine train --from-stream {stream} --data {stream_run} --out {run_dir}/out"
nproc_per_node = 2
env = { NCCL_DEBUG = "WARN" }
sync = ["s"]
"""


def test_a_pipeline_profile_has_its_parts(tmp_path: Path) -> None:
    p = load_config(write(tmp_path, PIPELINE)).profile("stream")
    pl = p.pipeline
    assert pl is not None and p.hosts == ["gpu1", "gpu2"] and p.run == ""
    assert (pl.store_host, pl.store_address) == ("gpu1", "10.0.0.1")
    assert pl.producer.hosts == ["gpu1"] and pl.producer.env == {"OMP_NUM_THREADS": "4"}
    assert pl.trainer.hosts == ["gpu2"] and pl.trainer.nproc_per_node == 2
    assert pl.trainer.env == {"OMP_NUM_THREADS": "4", "NCCL_DEBUG": "WARN"}
    assert pl.trainer.sync == ["s"]


ON_SLURM = 'scheduler = "slurm"\n[hosts.SELF.slurm]\npartition = "p"\naccount = "a"\n'
#: the trainer a batch job on gpu2, a Slurm login node
PIPELINE_ON_SLURM = PIPELINE.replace('[hosts.gpu2]\nssh = "root@gpu2.example"\n',
                                     '[hosts.gpu2]\nssh = "root@gpu2.example"\n'
                                     + ON_SLURM.replace("SELF", "gpu2")).replace(
    'nproc_per_node = 2\n', 'nproc_per_node = 2\nnodes = 2\n[profiles.stream.trainer.slurm]\n'
    'time = "30"\n').replace('env = { NCCL_DEBUG = "WARN" }\nsync = ["s"]\n', '')


def test_a_pipelines_trainer_may_be_a_slurm_job(tmp_path: Path) -> None:
    p = load_config(write(tmp_path, PIPELINE_ON_SLURM)).profile("stream")
    assert p.pipeline is not None and p.hosts == ["gpu1", "gpu2"]
    trainer = p.pipeline.trainer
    assert (trainer.hosts, trainer.nodes, trainer.nproc_per_node) == (["gpu2"], 2, 2)
    assert trainer.slurm is not None and trainer.slurm.time == "30"


@pytest.mark.parametrize("change, needle", [
    (('kind = "pipeline"', 'kind = "pipe"'), '[profiles.stream.kind] expected "run"'),
    (('[profiles.stream.store]\nhost = "gpu1"', '[profiles.stream.store]\nhost = "gpu9"'),
     "[profiles.stream.store.host] expected a configured host"),
    (("--to {stream}", "--to HOST"), "[profiles.stream.producer.run] expected a run string "
                                     "with {stream}"),
    (('nproc_per_node = 2', 'nproc_per_node = 0'), "[profiles.stream.trainer.nproc_per_node]"),
    (('[profiles.stream.producer]\n', '[profiles.stream.producer]\nnproc_per_node = 2\n'),
     "[profiles.stream.producer.nproc_per_node] expected one of the keys"),
    (('address = "10.0.0.1"', 'address = 7'), "[profiles.stream.store.address] expected a "
                                             "non-empty string"),
    (('address = "10.0.0.1"', 'address = "10.0.0.1 --x"'),
     "[profiles.stream.store.address] expected a host name or an IPv4 address"),
    (('[profiles.stream.trainer]\nhosts = ["gpu2"]\nrun = "engine train --from-stream {stream} '
      '--data {stream_run} --out {run_dir}/out"\n', ''),
     "[profiles.stream.trainer] expected a [profiles.stream.trainer] table"),
    (('nproc_per_node = 2', 'nproc_per_node = 2\nnodes = 2'),
     '[profiles.stream.trainer.nodes] expected a host with scheduler = "slurm"'),
])
def test_a_bad_pipeline_is_one_line_naming_its_key(tmp_path: Path, change: tuple[str, str],
                                                   needle: str) -> None:
    refused(tmp_path, PIPELINE, change, needle)


@pytest.mark.parametrize("change, needle", [
    (('[hosts.gpu1]\nssh = "gpu1"\n', '[hosts.gpu1]\nssh = "gpu1"\n'
      + ON_SLURM.replace("SELF", "gpu1")),
     "[profiles.stream.store.host] expected a plain SSH host or this machine (the console "
     "starts the store; only the trainer may be a Slurm job), not the Slurm host gpu1"),
    (('[profiles.stream.producer]\nhost = "gpu1"', '[profiles.stream.producer]\nhost = "gpu2"'),
     "[profiles.stream.producer.host] expected a plain SSH host or this machine (the console "
     "starts the producer"),
    (('hosts = ["gpu2"]', 'hosts = ["gpu2", "gpu1"]'),
     "[profiles.stream.trainer.hosts] expected one Slurm host"),
    (('partition = "p"\n', ''), "[profiles.stream.trainer] no Slurm partition: set partition "
                                 "in [hosts.gpu2.slurm] or [profiles.stream.trainer.slurm]"),
    (('time = "30"', 'time = "soon"'), "[profiles.stream.trainer.slurm.time]"),
])
def test_only_a_pipelines_trainer_may_be_on_a_slurm_host(tmp_path: Path, change: tuple[str, str],
                                                         needle: str) -> None:
    refused(tmp_path, PIPELINE_ON_SLURM, change, needle)


def refused(tmp_path: Path, text: str, change: tuple[str, str], needle: str) -> None:
    assert change[0] in text
    p = write(tmp_path, text.replace(*change))
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    msg = str(ei.value)
    assert str(p) in msg and needle in msg and "\n" not in msg, msg
