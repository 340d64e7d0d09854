"""The embedded default: with no config file, the `local` host and an offline demo workspace.

The workspace (`python -m engine demo init DIR`: a tiny target, prepared data and a "public"
drafter, see engine/demo/workspace.py) lives in the user's data directory and is built on the first
start through the local host, with a progress bar in the runs pane; later starts reuse it. The
defaults it adds:

    [profiles.finetune]   engine train from the demo's public drafter (keys and vocab remapped)
    [profiles.scratch]    engine train from random weights, for comparison
    local.checkpoints     the demo's public drafter (run outputs are listed anyway)
    local.logs            the workspace's recorded vLLM server log, for the Logs pane

so a new user presses `t` and watches a real CPU finetune finish in about 15 s. Each run
writes into its own run directory (`--out {run_dir}/out`, substituted by console/runs/service.py).
The training arguments are the workspace's own suggested commands (its demo.json, so a
workspace built by another engine version still gets the runs it was made for); before the
workspace exists they come from the copy below of engine/demo/workspace.py's `suggested_commands` (a
test keeps the two equal; the console must not import the engine's torch code).
"""

from __future__ import annotations

import json
import posixpath
import shlex
from pathlib import Path

from console.settings.config import LOCAL, Config, Profile, data_dir, load_config, local_host

DEMO = "demo"
#: the recorded vLLM log in the workspace (engine/demo/serve_log.py's SERVE_LOG)
SERVE_LOG = "logs/vllm-serve.log"
#: the workspace's held-out samples, prepared like data/ (engine/demo/workspace.py's eval/)
HELD_OUT_DATA = "eval"
#: the workspace's draft vocab size and the runs' lengths (engine/demo/workspace.py)
DRAFT_VOCAB = 96
FINETUNE_STEPS = 60
SCRATCH_STEPS = FINETUNE_STEPS   # engine/demo/workspace.py: equal steps
TRAIN_ARGS = ["--lr", "3e-3", "--batch-tokens", "1024", "--ttt-steps", "4", "--epochs", "40",
              "--warmup-ratio", "0.05", "--save-every", "50", "--holdout", "16"]
#: the demo's models are tiny: one thread each is as fast, and on a busy machine far faster
#: (OpenMP threads spinning on shared cores stall each other)
DEMO_ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def demo_dir() -> Path:
    """Where the workspace lives: the console's data directory."""
    return data_dir() / DEMO


def train_argv(workspace: str, kind: str, steps: int | None = None) -> list[str]:
    """`engine train ...` words of the demo's finetune or scratch run (--out left to the caller)."""
    d = workspace.rstrip("/")
    argv = ["engine", "train", "--target", f"{d}/target", "--data", f"{d}/data"]
    if kind == "finetune":
        argv += ["--finetune-from", f"{d}/public-drafter", "--rebuild-vocab",
                 "--draft-vocab-size", str(DRAFT_VOCAB),
                 "--max-steps", str(steps or FINETUNE_STEPS)]
    elif kind == "scratch":
        argv += ["--draft-vocab-size", str(DRAFT_VOCAB), "--max-steps", str(steps or SCRATCH_STEPS)]
    else:
        raise ValueError(f"unknown demo run {kind!r}")
    return argv + TRAIN_ARGS


def suggested_argv(workspace: str, kind: str) -> list[str] | None:
    """`engine train ...` words of the workspace's demo.json command (no --out), or None."""
    d = workspace.rstrip("/")
    try:
        info = json.loads((Path(d) / "demo.json").read_text(encoding="utf-8"))
        cmd = str(info["commands"][kind])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    # the engine writes the workspace path unquoted: keep it one word whatever it holds
    mark = "\0workspace\0"
    try:
        words = [w.replace(mark, d) for w in shlex.split(cmd.replace(d, mark))]
    except ValueError:
        return None
    if words[:3] != ["python", "-m", "engine"] or "--out" not in words[:-1]:
        return None
    i = words.index("--out")
    return ["engine", *words[3:i], *words[i + 2:]]


def demo_profiles(workspace: str, host: str = LOCAL, steps: int | None = None,
                  extra: list[str] | None = None) -> dict[str, Profile]:
    """The `finetune` and `scratch` profiles on host (steps / extra args: shorter test runs)."""
    out = {}
    for kind in ("finetune", "scratch"):
        base = suggested_argv(workspace, kind) if steps is None else None
        words = [*(base or train_argv(workspace, kind, steps)), "--out", "{run_dir}/out",
                 *(extra or [])]
        out[kind] = Profile(name=kind, hosts=[host], run=shlex.join(words), env=dict(DEMO_ENV))
    return out


def with_demo(config: Config, workspace: Path | None = None) -> Config:
    """Add the demo to a config that has nothing else (no file, or a file with only a theme)."""
    d = str(workspace or demo_dir())
    if LOCAL not in config.hosts:
        config.hosts[LOCAL] = local_host()
    local = config.hosts[LOCAL]
    drafter = posixpath.join(d, "public-drafter")
    if drafter not in local.checkpoints:
        local.checkpoints.append(drafter)
    log = posixpath.join(d, SERVE_LOG)
    if log not in local.logs:
        local.logs.append(log)
    for name, profile in demo_profiles(d).items():
        config.profiles.setdefault(name, profile)
    config.demo = d
    return config


def refresh_demo_profiles(config: Config) -> None:
    """After the first build: the profiles as the new workspace's demo.json says."""
    if config.demo is None:
        return
    for name, profile in demo_profiles(config.demo).items():
        if name in config.profiles and config.profiles[name].hosts == [LOCAL]:
            config.profiles[name] = profile


def add_demo(config: Config) -> Config:
    """The demo added to a built-in config (no config of the user's) or one that asks for it
    (`demo = true`); others are left alone."""
    if (config.builtin or config.keep_demo) and config.demo is None:
        with_demo(config)
    return config


def console_config(path: str | Path | None = None) -> Config:
    """The config the console runs on: the user's file (or the built-in default), plus the
    demo when the user has no config of their own."""
    return add_demo(load_config(path))
