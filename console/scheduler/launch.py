"""What a launch does the same whatever places the run (console/scheduler/ssh.py and slurm.py):
run ids, a profile's `run` string made argv, the push before a start, and the caller's hooks.

A run id is `<profile>-<YYYYmmdd-HHMMSS>-<4 hex>`; a multi-node run has the same id and one
directory (one record, its node_rank) on every host. How a profile's `run` string becomes argv:

    engine CMD ...            PYTHON -m engine CMD ... --events  (PYTHONPATH=ROOT/code first)
    python[3] script.py ...   PYTHON script.py ...               (the host's configured Python)
    anything else             as written (split like a shell would, never run by one)

`{run_dir}` and `{run_id}` in the run string or cwd become this run's directory and id (e.g.
`engine train ... --out {run_dir}/out`: a run's outputs live beside its log, ROOT/runs/<id>);
a profile's `eval_server` adds `--eval-server URL` to its `engine train` command,

and with nproc_per_node > 1 or several hosts the same under `PYTHON -m torch.distributed.run`
(`--standalone` on one host; `--nnodes N --node-rank R --rdzv-backend c10d --rdzv-endpoint
FIRST_HOST:PORT --rdzv-id RUN_ID` across hosts; the address is the first host's SSH host name,
or its first `hostname -I` address for an ssh-config alias; MASTER_ADDR / MASTER_PORT in the
profile's env override address and port).
"""

from __future__ import annotations

import secrets
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from console.errors import ConfigError, ConsoleError
from console.hosts.host import Host
from console.hosts.push import PushReport, engine_trees, push, sync_tree
from console.scheduler.run_record import RunRecord
from console.scheduler.run_status import RunStatus
from console.settings.config import Config, HostConfig, Profile


@dataclass(frozen=True)
class Rendezvous:
    """Where the nodes of a multi-node run meet (c10d on the first host)."""

    host: str
    port: int


def new_run_id(profile: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in profile)
    return f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


RUN_TAIL = 11          # HHMMSS-xxxx: the end of every run id, what tells runs apart


def fit_id(run_id: str, width: int) -> str:
    """A run id in `width` columns, cut in the middle (its start names the profile, its end
    the time and suffix): `serve-finetune-20261…170000-abcd`."""
    if len(run_id) <= width:
        return run_id
    tail = min(RUN_TAIL, (width - 1) // 2)
    return run_id[:width - 1 - tail] + "…" + run_id[-tail:]


def run_env(profile: Profile, cfg: HostConfig) -> dict[str, str]:
    """A run's environment on a host: the host's `env`, then the profile's over it (less the
    rendezvous settings, which place the run rather than reach it)."""
    merged = {**cfg.env, **profile.env}
    return {k: v for k, v in merged.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}


def substitute(text: str, run_id: str, run_dir: str) -> str:
    """`{run_id}` and `{run_dir}` in a profile's run words and cwd (nothing else is touched:
    other braces, e.g. JSON arguments, stay as written)."""
    return text.replace("{run_dir}", run_dir).replace("{run_id}", run_id)


def build_argv(profile: Profile, cfg: HostConfig, *, run_id: str, node_rank: int | str = 0,
               rdzv: Rendezvous | str | None = None, run_dir: str = "",
               nnodes: int | None = None) -> tuple[list[str], bool]:
    """argv for one node, and whether it is an engine command (see the module docstring).
    nnodes: the node count when it is not len(profile.hosts) (a Slurm job's `nodes`); rdzv
    may be the endpoint as text (a placeholder the node fills in)."""
    try:
        words = [substitute(w, run_id, run_dir) for w in shlex.split(profile.run)]
    except ValueError as e:
        raise ConfigError(f"[profiles.{profile.name}] run: cannot split {profile.run!r}: "
                          f"{e}") from e
    if not words:
        raise ConfigError(f"[profiles.{profile.name}] run: empty command")
    is_engine = words[0] == "engine"
    if is_engine:
        tail = ["-m", "engine", *words[1:]]
        if profile.eval_server and "--eval-server" not in tail:
            tail += ["--eval-server", profile.eval_server]
        if "--events" not in tail:
            tail.append("--events")
        python_tail: list[str] | None = tail
    elif words[0] in ("python", "python3"):
        python_tail = words[1:]
    else:
        python_tail = None
    if nnodes is None:
        nnodes = len(profile.hosts)
    if profile.nproc_per_node <= 1 and nnodes == 1 or words[0] in ("torchrun",):
        if python_tail is None:
            return words, False
        return [cfg.python, *python_tail], is_engine
    dist = [cfg.python, "-m", "torch.distributed.run",
            "--nproc-per-node", str(profile.nproc_per_node)]
    if nnodes == 1:
        dist.append("--standalone")
    else:
        assert rdzv is not None
        endpoint = rdzv if isinstance(rdzv, str) else f"{rdzv.host}:{rdzv.port}"
        dist += ["--nnodes", str(nnodes), "--node-rank", str(node_rank),
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                 "--rdzv-id", run_id]
    if python_tail is None:
        return [*dist, "--no-python", *words], False
    return [*dist, *python_tail], is_engine


@dataclass
class LaunchHooks:
    """What a launch tells and asks its caller as it goes: the runs pane passes all three; the
    CLI none (a second copy is refused unless --force, and the report is printed at the end)."""

    #: the profile is already running (these records): start another copy?
    confirm: Callable[[list[RunRecord]], Awaitable[bool]] | None = None
    #: a step begins ("pushing to gpu1", "starting")
    step: Callable[[str], None] | None = None
    #: a push's progress on one host: host name, files done, files to send, bytes sent
    progress: Callable[[str, int, int, int], None] | None = None


class NotStarted(ConsoleError):
    """The profile is already running and the caller's confirm hook said not to start another."""


async def start_anyway(name: str, busy: list[RunRecord], where: str,
                       hooks: LaunchHooks | None, queued: bool = False) -> bool:
    """Whether to start although `busy` runs of profile `name` are active: the confirm hook
    decides (False raises NotStarted); without one, a one-line refusal naming them."""
    if hooks is not None and hooks.confirm is not None:
        if await hooks.confirm(busy):
            return True
        raise NotStarted(f"not started: {name} is already running")
    state = "running or queued" if queued else RunStatus.RUNNING.value
    raise ConsoleError(f"profile {name!r} is already {state} ({where}); "
                       f"stop it or launch with --force")


async def push_for(config: Config, profile: Profile, host: Host,
                   hooks: LaunchHooks | None = None) -> PushReport:
    """Push the engine and the profile's sync sets (only what changed) before a start."""
    if hooks is not None and hooks.step is not None:
        hooks.step(f"pushing to {host.name}…")
    progress = hooks.progress if hooks is not None else None
    trees = await engine_trees(host)
    for s in profile.sync:
        trees.append(await sync_tree(host, config.syncs[s]))
    report = await push(host, trees, on_progress=None if progress is None else
                        lambda done, total, sent: progress(host.name, done, total, sent))
    if hooks is not None and hooks.step is not None:
        hooks.step(f"starting {profile.name}…")
    return report
