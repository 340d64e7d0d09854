"""The console's configuration: TOML at the XDG config path, or built-in defaults.

    [hosts.gpu1]
    ssh = "gpu1"          # ~/.ssh/config alias, or user@host[:port]; omit for this machine
    python = "/root/venv/bin/python"  # the interpreter that has torch on that host
    root = "/root/eagle3"             # where engine code and runs live there
    logs = ["/root/vllm.log"]         # files the logs pane follows
    checkpoints = ["/data/ckpts"]     # folders the checkpoints pane browses
    known_hosts = "~/.ssh/known_hosts"  # optional: which known_hosts file verifies this host
    identity = "~/.ssh/id_ed25519"      # optional: a key file (else ssh-agent and ssh config)
    metrics = "http://127.0.0.1:8000/metrics"  # optional: vLLM's /metrics, seen from the host
    vllm = "/opt/vllm-env/bin/vllm"   # optional: how `serve` starts vLLM (words; default: the
                                      # `vllm` beside `python`, else the one on PATH)
    env = { HF_HOME = "/data/hf", CUDA_VISIBLE_DEVICES = "0,1,2,3" }  # optional: every run's

    [sync.train-scripts]
    host = "gpu1"
    local = "~/work/eagle3-train"
    remote = "/root/eagle3-train"
    exclude = ["__pycache__/", "*.pyc"]

    [profiles.finetune]
    host = "gpu1"                     # or hosts = ["gpu1", "gpu2"] for a multi-node run
    run = "engine train --target /data/kimi --data /data/eagle3 --finetune-from /data/aq-medai"
    nproc_per_node = 8
    env = { NCCL_DEBUG = "WARN" }
    cwd = "/root/eagle3-train"
    sync = ["train-scripts"]
    eval_server = "http://127.0.0.1:8000"  # optional, an `engine train` run: its serving vLLM
                                      # on the host's loopback (train --eval-server)

    [profiles.stream]                 # a pipeline: a stream's store, its producer, its trainer
    kind = "pipeline"
    [profiles.stream.store]
    host = "gpu1"                     # runs `engine stream-master` there
    address = "10.0.0.1"              # optional: where the others reach it (else as torchrun's)
    [profiles.stream.producer]
    host = "gpu1"
    run = "engine stream-put --data /data/eagle3 --to {stream} --run {stream_run}"
    [profiles.stream.trainer]
    hosts = ["gpu2"]
    run = "engine train --target /data/kimi --from-stream {stream} --data {stream_run} ..."
    nproc_per_node = 8

`{stream}` in a part's run string becomes the store's address, `{stream_run}` the stream run's
name (the pipeline's run id); each part also takes env, cwd and sync, the trainer
nproc_per_node (console/scheduler/pipeline.py launches them).

Errors name the file, the key (and line for TOML syntax errors) and what was expected.
"""

from __future__ import annotations

import os
import posixpath
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from console.errors import ConfigError
from console.settings.slurm_options import SlurmOptions, missing, parse_scheduler, parse_slurm

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

APP = "eagle3-console"
LOCAL = "local"


def config_dir() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / APP


def data_dir() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / APP


def default_config_path() -> Path:
    return config_dir() / "config.toml"


@dataclass
class HostConfig:
    """One host the console can reach."""

    name: str
    ssh: str | None = None          # None: this machine, no SSH
    python: str = "python3"
    root: str = "~/eagle3"
    logs: list[str] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)
    known_hosts: str | None = None
    ssh_config: str | None = None
    identity: str | None = None
    metrics: str | None = None      # vLLM's /metrics URL as seen from the host (http://...)
    scheduler: str = "ssh"          # "slurm": a cluster's login node (console/scheduler/)
    slurm: SlurmOptions | None = None  # [hosts.X.slurm] sbatch defaults
    vllm: str | None = None         # how `serve` starts vLLM; None: the vllm beside `python`
    env: dict[str, str] = field(default_factory=dict)  # for every run started there

    @property
    def is_local(self) -> bool:
        return self.ssh is None


@dataclass
class SyncSet:
    """A local folder mirrored to a host by `push`."""

    name: str
    host: str
    local: str
    remote: str
    exclude: list[str] = field(default_factory=list)


@dataclass
class Profile:
    """A launchable command: what runs, where, with how many processes."""

    name: str
    hosts: list[str]
    run: str
    nproc_per_node: int = 1
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    sync: list[str] = field(default_factory=list)
    nodes: int = 1                  # Slurm nodes (a host with scheduler = "slurm" only)
    slurm: SlurmOptions | None = None  # [profiles.P.slurm]: overrides the host's
    #: an `engine train` run's serving vLLM on its host's loopback: `--eval-server URL`
    eval_server: str | None = None
    #: kind = "pipeline": its parts (hosts: every part's host, run: "")
    pipeline: Pipeline | None = None


#: the parts of a pipeline, in the order they start (and the reverse of the order they stop)
PARTS = ("store", "producer", "trainer")


@dataclass
class Pipeline:
    """A streamed training pipeline: the store (a Mooncake master) on one host, a producer and
    a trainer that meet there. The producer and the trainer are profiles of their own (named
    `P.producer`, `P.trainer`: run, hosts, nproc_per_node, env, cwd, sync)."""

    store_host: str
    producer: Profile
    trainer: Profile
    #: the address the other hosts reach the store at; None: chosen as torchrun's rendezvous
    store_address: str | None = None
    store_env: dict[str, str] = field(default_factory=dict)


@dataclass
class Config:
    """Everything the console knows about hosts, sync sets and profiles."""

    hosts: dict[str, HostConfig]
    syncs: dict[str, SyncSet] = field(default_factory=dict)
    profiles: dict[str, Profile] = field(default_factory=dict)
    theme: str | None = None
    path: Path | None = None        # None: built-in defaults, no file
    demo: str | None = None         # the embedded demo workspace (console/demo/config.py)
    #: `demo = true` at the top of the file: the demo (local host, its profiles) stays beside
    #: the user's hosts and profiles
    keep_demo: bool = False
    #: no config of the user's (no file, or one holding only a remembered theme): the app factory
    #: and the CLI add the demo (console/demo/config.py), config loading never does
    builtin: bool = False

    def host(self, name: str) -> HostConfig:
        try:
            return self.hosts[name]
        except KeyError:
            known = ", ".join(self.hosts) or "none"
            raise ConfigError(f"unknown host {name!r} (configured: {known})") from None

    def profile(self, name: str) -> Profile:
        try:
            return self.profiles[name]
        except KeyError:
            known = ", ".join(self.profiles) or "none"
            raise ConfigError(f"unknown profile {name!r} (configured: {known})") from None


def local_host() -> HostConfig:
    """The built-in host: this machine, the interpreter running the console."""
    return HostConfig(name=LOCAL, ssh=None, python=sys.executable, root=str(data_dir() / "host"))


def default_config() -> Config:
    """What the console uses with no config file: the local host (the app factory and the CLI
    add the embedded demo)."""
    return Config(hosts={LOCAL: local_host()}, builtin=True)


def load_config(path: str | Path | None = None) -> Config:
    """Load the config at path (or the XDG default). No file at the default path: defaults."""
    explicit = path is not None
    p = Path(path).expanduser() if path is not None else default_config_path()
    if not p.exists():
        if explicit:
            raise ConfigError(f"{p}: no such config file")
        return default_config()
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: invalid TOML: {e}") from e
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read: {e}") from e
    config = parse_config(raw, p)
    if not set(raw) - {"theme"}:  # only a remembered theme: still the built-in default
        config.builtin = True
        config.hosts.setdefault(LOCAL, local_host())
    return config


# -- validation -----------------------------------------------------------------------------------

class _Reader:
    """Typed access to one table, with errors that name file and key."""

    def __init__(self, file: Path, prefix: str, table: Any) -> None:
        self.file, self.prefix = file, prefix
        if not isinstance(table, dict):
            self.fail("", "a table")
        self.table: dict[str, Any] = table

    def fail(self, key: str, expected: str, got: Any = None) -> None:
        where = ".".join(x for x in (self.prefix, key) if x) or "top level"
        tail = f", got {type(got).__name__} {got!r}" if got is not None else ""
        raise ConfigError(f"{self.file}: [{where}] expected {expected}{tail}")

    def check_keys(self, allowed: set[str]) -> None:
        for k in self.table:
            if k not in allowed:
                self.fail(k, "one of the keys " + ", ".join(sorted(allowed))
                          + f" (unknown key {k!r})")

    def text(self, key: str, default: str | None = None, required: bool = False) -> str | None:
        v = self.table.get(key, default)
        if v is None:
            if required:
                self.fail(key, "a string (required)")
            return None
        if not isinstance(v, str) or not v:
            self.fail(key, "a non-empty string", v)
        return v

    def strlist(self, key: str) -> list[str]:
        v = self.table.get(key, [])
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            self.fail(key, "a list of strings", v)
        return list(v)

    def count(self, key: str, default: int) -> int:
        v = self.table.get(key, default)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            self.fail(key, "a positive integer", v)
        return v

    def strdict(self, key: str) -> dict[str, str]:
        v = self.table.get(key, {})
        if not isinstance(v, dict):
            self.fail(key, "a table of strings", v)
        out = {}
        for k, x in v.items():
            if not isinstance(x, (str, int, float)) or isinstance(x, bool):
                self.fail(f"{key}.{k}", "a string", x)
            out[str(k)] = str(x)
        return out


def parse_config(raw: dict[str, Any], file: Path) -> Config:
    top = _Reader(file, "", raw)
    top.check_keys({"hosts", "sync", "profiles", "theme", "demo"})
    keep_demo = raw.get("demo", False)
    if not isinstance(keep_demo, bool):
        top.fail("demo", "true or false", keep_demo)
    hosts: dict[str, HostConfig] = {}
    for name, t in _tables(top, "hosts").items():
        r = _Reader(file, f"hosts.{name}", t)
        r.check_keys({"ssh", "python", "root", "logs", "checkpoints", "known_hosts", "ssh_config",
                      "identity", "metrics", "scheduler", "slurm", "vllm", "env"})
        base = local_host() if r.text("ssh") is None else HostConfig(name=name)
        hosts[name] = HostConfig(
            name=name, ssh=r.text("ssh"), python=r.text("python", base.python) or base.python,
            root=r.text("root", base.root) or base.root, logs=r.strlist("logs"),
            checkpoints=r.strlist("checkpoints"), known_hosts=r.text("known_hosts"),
            ssh_config=r.text("ssh_config"), identity=r.text("identity"),
            metrics=_metrics_url(r),
            scheduler=parse_scheduler(r.table.get("scheduler"), file, f"hosts.{name}"),
            slurm=(parse_slurm(r.table["slurm"], file, f"hosts.{name}.slurm")
                   if "slurm" in r.table else None),
            vllm=r.text("vllm"), env=r.strdict("env"))
        if hosts[name].slurm is not None and hosts[name].scheduler != "slurm":
            r.fail("slurm", 'scheduler = "slurm" with a [slurm] table')
    if LOCAL not in hosts:
        hosts[LOCAL] = local_host()
    syncs: dict[str, SyncSet] = {}
    for name, t in _tables(top, "sync").items():
        r = _Reader(file, f"sync.{name}", t)
        r.check_keys({"host", "local", "remote", "exclude"})
        host = r.text("host", required=True) or ""
        if host not in hosts:
            r.fail("host", f"a configured host ({', '.join(hosts)})", host)
        remote = r.text("remote", required=True) or ""
        why = sync_remote_problem(remote, hosts[host].root)
        if why is not None:
            raise ConfigError(f"{file}: [sync.{name}] remote = {remote!r} is refused: {why}")
        syncs[name] = SyncSet(name=name, host=host, local=r.text("local", required=True) or "",
                              remote=remote, exclude=r.strlist("exclude"))
    profiles: dict[str, Profile] = {}
    for name, t in _tables(top, "profiles").items():
        r = _Reader(file, f"profiles.{name}", t)
        if r.table.get("kind", "run") == "pipeline":
            profiles[name] = _pipeline(r, name, hosts, syncs)
            continue
        if r.table.get("kind", "run") != "run":
            r.fail("kind", '"run" (the default) or "pipeline"', r.table["kind"])
        r.check_keys({"kind", "host", "hosts", "run", "nproc_per_node", "env", "cwd", "sync",
                      "nodes", "slurm", "eval_server"})
        phosts, sync = _hosts(r, hosts), _syncs(r, syncs)
        profiles[name] = Profile(name=name, hosts=phosts, run=r.text("run", required=True) or "",
                                 nproc_per_node=r.count("nproc_per_node", 1), env=r.strdict("env"),
                                 cwd=r.text("cwd"), sync=sync, eval_server=_eval_server(r))
        _slurm_profile(r, profiles[name], hosts)
    return Config(hosts=hosts, syncs=syncs, profiles=profiles, theme=top.text("theme"), path=file,
                  keep_demo=keep_demo)


def _hosts(r: _Reader, hosts: dict[str, HostConfig]) -> list[str]:
    """A profile's (or a part's) `host` or `hosts`: configured hosts, at least one."""
    if "host" in r.table and "hosts" in r.table:
        r.fail("hosts", "either host or hosts, not both")
    found = r.strlist("hosts") if "hosts" in r.table else [r.text("host", required=True) or ""]
    if not found:
        r.fail("hosts", "at least one host")
    for h in found:
        if h not in hosts:
            r.fail("host", f"a configured host ({', '.join(hosts)})", h)
    return found


def _syncs(r: _Reader, syncs: dict[str, SyncSet]) -> list[str]:
    sync = r.strlist("sync")
    for s in sync:
        if s not in syncs:
            r.fail("sync", f"names of [sync.*] sets ({', '.join(syncs) or 'none defined'})", s)
    return sync


def _pipeline(r: _Reader, name: str, hosts: dict[str, HostConfig],
              syncs: dict[str, SyncSet]) -> Profile:
    """A `kind = "pipeline"` profile: [P.store] host (+ address, env), [P.producer] host + run,
    [P.trainer] host(s) + run (+ nproc_per_node; on a Slurm host, nodes and [P.trainer.slurm]);
    the store and the producer on a plain SSH host (or this machine), and the producer's and
    the trainer's run strings naming `{stream}`."""
    r.check_keys({"kind", "store", "producer", "trainer", "env", "sync"})
    env, sync = r.strdict("env"), _syncs(r, syncs)
    tables = {}
    for part in PARTS:
        if part not in r.table:
            r.fail(part, f"a [profiles.{name}.{part}] table")
        tables[part] = _Reader(r.file, f"{r.prefix}.{part}", r.table[part])
    store = tables["store"]
    store.check_keys({"host", "address", "env"})
    store_host = store.text("host", required=True) or ""
    if store_host not in hosts:
        store.fail("host", f"a configured host ({', '.join(hosts)})", store_host)
    parts: dict[str, Profile] = {}
    for part, multi in (("producer", False), ("trainer", True)):
        t = tables[part]
        t.check_keys({"host", "run", "env", "cwd", "sync"}
                     | ({"hosts", "nproc_per_node", "nodes", "slurm"} if multi else set()))
        run = t.text("run", required=True) or ""
        if "{stream}" not in run:
            t.fail("run", "a run string with {stream} where the store's address goes", run)
        parts[part] = Profile(name=f"{name}.{part}", hosts=_hosts(t, hosts), run=run,
                              nproc_per_node=t.count("nproc_per_node", 1),
                              env={**env, **t.strdict("env")}, cwd=t.text("cwd"),
                              sync=sorted({*sync, *_syncs(t, syncs)}))
    _slurm_profile(tables["trainer"], parts["trainer"], hosts)   # a Slurm job, or not
    placed = {"store": [store_host], "producer": parts["producer"].hosts,
              "trainer": parts["trainer"].hosts}
    for part in ("store", "producer"):
        for h in placed[part]:
            if hosts[h].scheduler != "ssh":
                tables[part].fail("host", f"a plain SSH host or this machine (the console "
                                  f"starts the {part}; only the trainer may be a Slurm job), "
                                  f"not the Slurm host {h}")
    every = list(dict.fromkeys(h for on in placed.values() for h in on))
    address = store.text("address")
    if address is not None and not re.fullmatch(r"[A-Za-z0-9.\-]+", address):
        store.fail("address", "a host name or an IPv4 address (what the others reach the "
                   "store at)", address)
    pipeline = Pipeline(store_host=store_host, producer=parts["producer"],
                        trainer=parts["trainer"], store_address=address,
                        store_env={**env, **store.strdict("env")})
    return Profile(name=name, hosts=every, run="", env=env, sync=sync, pipeline=pipeline)


def _slurm_profile(r: _Reader, p: Profile, hosts: dict[str, HostConfig]) -> None:
    """A profile's `nodes` and `[profiles.P.slurm]`; on a Slurm host, partition and account
    must be set (the host's defaults or the profile's)."""
    p.nodes = r.count("nodes", 1)
    if "slurm" in r.table:
        p.slurm = parse_slurm(r.table["slurm"], r.file, f"profiles.{p.name}.slurm")
    cluster = [h for h in p.hosts if hosts[h].scheduler == "slurm"]
    if not cluster:
        if "nodes" in r.table or p.slurm is not None:
            r.fail("nodes" if "nodes" in r.table else "slurm",
                   'a host with scheduler = "slurm" (use hosts = [...] for plain SSH nodes)')
        return
    if len(p.hosts) != 1:
        r.fail("hosts", "one Slurm host (the scheduler picks the nodes: set nodes = N)")
    h = hosts[cluster[0]]
    for key in missing((h.slurm or SlurmOptions()).merged(p.slurm)):
        raise ConfigError(f"{r.file}: [profiles.{p.name}] no Slurm {key}: set {key} in "
                          f"[hosts.{h.name}.slurm] or [profiles.{p.name}.slurm]")


def _metrics_url(r: _Reader) -> str | None:
    """The optional `metrics` URL: an http:// URL (fetched from the host's side)."""
    from console.settings.metrics_url import split_url
    url = r.text("metrics")
    if url is not None:
        try:
            split_url(url)
        except ValueError as e:
            r.fail("metrics", str(e), url)
    return url


def _eval_server(r: _Reader) -> str | None:
    """A profile's optional `eval_server`: the base URL of a vLLM on the run's host's loopback
    (its weight-update routes load the host's folders), for an `engine train` run only."""
    from console.settings.metrics_url import split_url
    url = r.text("eval_server")
    if url is None:
        return None
    try:
        ep = split_url(url)
    except ValueError as e:
        r.fail("eval_server", str(e).replace("/metrics", ""), url)
    if ep.host not in ("127.0.0.1", "localhost", "::1") or ep.path not in ("/", ""):
        r.fail("eval_server", "the base URL of a vLLM on the host's loopback, such as "
               "http://127.0.0.1:8000", url)
    if (r.table.get("run") or "").split()[:2] != ["engine", "train"]:
        r.fail("eval_server", "a profile whose run is `engine train ...`", url)
    return url.rstrip("/")


def _tables(top: _Reader, key: str) -> dict[str, Any]:
    v = top.table.get(key, {})
    if not isinstance(v, dict):
        top.fail(key, "a table of tables", v)
    return v


#: folders under a host's root that belong to the console (a sync set there could overwrite or,
#: with --delete, remove what the console itself keeps)
RESERVED_UNDER_ROOT = ("code", "runs", "manifests")
_HOME = "/\0home"  # stands for `~` while comparing paths lexically


def _norm(path: str) -> str:
    """Lexical normal form; `~` and relative paths (SFTP: relative to home) under _HOME."""
    if path == "~" or path.startswith("~/"):
        path = _HOME + path[1:]
    elif not path.startswith("/"):
        path = _HOME + "/" + path
    return posixpath.normpath(path)


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def sync_remote_problem(remote: str, root: str) -> str | None:
    """Why a sync set may not use `remote` on a host whose root is `root`, or None.

    Refused: `/`, the root itself or a folder above it, and the console's own folders below it.
    Paths are compared as written (after `..` folding); a `~` path cannot be compared with an
    absolute one here, so console/hosts/push.py checks again with both resolved on the host."""
    p, r = _norm(remote), _norm(root)
    if p == "/":
        return ("it is the filesystem root" if remote.startswith("/")
                else "it climbs out of the home folder")
    if p.startswith(_HOME) != r.startswith(_HOME):
        return None  # one is under ~, the other absolute: decided once resolved on the host
    if _within(r, p):
        return f"it holds the host's root {root} (runs, code and push records live there)"
    for sub in RESERVED_UNDER_ROOT:
        if _within(p, posixpath.join(r, sub)):
            return f"it is inside {posixpath.join(root, sub)}, which the console manages itself"
    return None
