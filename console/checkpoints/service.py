"""Checkpoints on a host: find them, inspect them, convert them (the checkpoints pane's service).

Where it looks: the host's configured `checkpoints` folders, the outputs of its runs
(ROOT/runs/<run-id>/..., e.g. `out/final`, `out/best`, `out/checkpoints/step_N`) and what was
converted from the console (ROOT/converted/). A checkpoint is a folder holding `config.json`
and weights (`*.safetensors`, a sharded index or `pytorch_model.bin`); the scan does not look
inside one. It is one command on the host (a standard-library script run by the host's
Python), bounded in depth and count.

Inspect and convert are `python -m engine inspect|convert ... --events` through Host.engine, so
the report is the engine's own (the same as `eagle3-console inspect`), progress comes as events,
and the engine's error message reaches the caller whole.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import console.hostside.checkpoint_scan as checkpoint_scan
from console.checkpoints.results import (
    Checkpoint,
    ConvertSummary,
    InspectReport,
    parse_scan,
)
from console.errors import CommandFailed, ConsoleError
from console.hosts.engine_client import EngineError, run_engine
from console.hosts.host import Host
from engine import events

__all__ = ["DTYPES", "STYLES", "Checkpoint", "ConvertSummary", "Found", "InspectReport",
           "convert_checkpoint", "converted_dir", "find_checkpoints", "inspect_checkpoint",
           "scan_checkpoints"]

STYLES = ("eagle", "speculators", "vllm", "sglang")
DTYPES = ("keep", "bf16", "fp16", "fp32")
MAX_DEPTH = 5
MAX_ENTRIES = 500

#: the checkpoint scan, run by the host's Python through `python -c` (its source, so nothing
#: needs to be pushed first): console/hostside/checkpoint_scan.py
_SCAN = Path(checkpoint_scan.__file__).read_text(encoding="utf-8")


async def converted_dir(host: Host) -> str:
    """Where conversions started from the console go by default: ROOT/converted."""
    return posixpath.join(await host.root(), "converted")


@dataclass(frozen=True)
class Found:
    """What a scan found, and the configured folders it could not read (folder, why)."""

    checkpoints: list[Checkpoint]
    missing: list[tuple[str, str]]


async def find_checkpoints(host: Host) -> list[Checkpoint]:
    """Every checkpoint under the configured folders, the run outputs and ROOT/converted."""
    return (await scan_checkpoints(host)).checkpoints


async def scan_checkpoints(host: Host) -> Found:
    """find_checkpoints, with the configured folders that do not exist (or cannot be read)."""
    await host.connect()
    root = await host.root()
    roots: list[tuple[str, str, bool]] = [
        (await host.resolve(f), "configured", False) for f in host.cfg.checkpoints]
    roots += [(posixpath.join(root, "runs"), "run", True),
              (await converted_dir(host), "converted", False)]
    req = {"roots": roots, "depth": MAX_DEPTH, "max": MAX_ENTRIES}
    try:
        res = await host.transport.run([host.cfg.python, "-c", _SCAN], input=json.dumps(req),
                                       check=True, timeout=120)
        data = json.loads(res.stdout)
    except CommandFailed as e:
        raise ConsoleError(f"{host.name}: cannot list checkpoints with {host.cfg.python}: "
                           f"{e}") from e
    except ValueError as e:
        raise ConsoleError(f"{host.name}: the checkpoint scan printed no list") from e
    return Found(*parse_scan(data, host.name))


async def inspect_checkpoint(host: Host, path: str) -> InspectReport:
    """The engine's inspect report (`ok` false when a check failed: the report says which).

    Raises EngineError when the folder cannot be read as a checkpoint at all."""
    got: list[events.Result] = []

    def grab(ev: events.Event) -> None:
        if isinstance(ev, events.Result):
            got.append(ev)

    try:
        # `--`: a folder named like an option (`--help`, `-x`) is still a folder
        data = await run_engine(host, ["inspect", "--", path], on_event=grab, timeout=600)
    except EngineError:
        if not got:
            raise
        data = dict(got[-1].data)   # inspect exits 1 when a check fails, after its report
    return InspectReport.parse(data)


def convert_args(src: str, dst: str, to: str, dtype: str = "keep", force: bool = False,
                 verifier: str | None = None, extra: list[str] | None = None) -> list[str]:
    """The `engine convert` arguments (checked here so a typo never reaches the host)."""
    if to not in STYLES:
        raise ConsoleError(f"--to: {to!r} is not one of {', '.join(STYLES)}")
    if dtype not in DTYPES:
        raise ConsoleError(f"--dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    if not dst.strip():
        raise ConsoleError("destination: empty path")
    # options first, then `--` and the two folders, so a path like `-x` is never an option
    return ["convert", "--to", to, "--dtype", dtype, *(["--force"] if force else []),
            *([f"--verifier={verifier}"] if verifier else []), *(extra or []), "--", src, dst]


async def convert_checkpoint(host: Host, src: str, dst: str, to: str, dtype: str = "keep",
                             force: bool = False, verifier: str | None = None,
                             on_event: Callable[[events.Event], None] | None = None,
                             extra: list[str] | None = None) -> ConvertSummary:
    """Run `engine convert` on the host; its summary. Raises EngineError with the engine's
    message (DST is then absent: the engine writes a temp folder and renames it at the end)."""
    args = convert_args(src, dst, to, dtype, force, verifier, extra)
    await host.connect()
    parent = posixpath.dirname(dst.rstrip("/"))
    if parent:
        await host.transport.run(["mkdir", "-p", parent], check=True)
    return ConvertSummary.parse(await run_engine(host, args, on_event=on_event, timeout=None),
                                dst)
