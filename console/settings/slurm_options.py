"""Slurm options of a cluster host (`[hosts.X.slurm]`) and a profile's overrides
(`[profiles.P.slurm]`), checked the way sbatch would read them, with errors naming file and key.

    [hosts.cluster]
    ssh = "me@login.cluster.org"
    scheduler = "slurm"
    root = "/shared/me/eagle3"        # on the shared filesystem: the nodes see code and runs
    python = "/shared/me/venv/bin/python"
    [hosts.cluster.slurm]
    partition = "gpu"                 # required (here or in the profile)
    account = "proj123"               # required (here or in the profile)
    qos = "normal"
    time = "1-00:00:00"               # MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
    gpus_per_node = 8
    cpus_per_task = 32
    mem = "500G"                      # sbatch --mem: a number with an optional K/M/G/T
    extra = ["--exclusive", "--constraint=h100"]   # more sbatch options, one per line
    conf = "/etc/slurm/slurm.conf"    # optional: SLURM_CONF for the Slurm commands
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from console.errors import ConfigError

SCHEDULERS = ("ssh", "slurm")
KEYS = ("partition", "account", "qos", "time", "gpus_per_node", "cpus_per_task", "mem",
        "extra", "conf")
REQUIRED = ("partition", "account")

_NAME = re.compile(r"^[A-Za-z0-9_.,+-]+$")          # partition/account/qos (a list for partition)
_MEM = re.compile(r"^[0-9]+[KMGTkmgt]?$")
_TIME_FORMS = (  # Slurm's --time forms (src/common/parse_time.c: time_str2mins)
    re.compile(r"^(?P<m>\d+)$"),
    re.compile(r"^(?P<m>\d+):(?P<s>\d+)$"),
    re.compile(r"^(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)$"),
    re.compile(r"^(?P<d>\d+)-(?P<h>\d+)$"),
    re.compile(r"^(?P<d>\d+)-(?P<h>\d+):(?P<m>\d+)$"),
    re.compile(r"^(?P<d>\d+)-(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)$"),
)


@dataclass(frozen=True)
class SlurmOptions:
    """sbatch options; None: not set here (a profile's value overrides the host's)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    extra: tuple[str, ...] = field(default_factory=tuple)
    conf: str | None = None

    def merged(self, override: SlurmOptions | None) -> SlurmOptions:
        """These defaults with override's set values on top (extra lines: both, in order)."""
        if override is None:
            return self
        changes = {f.name: getattr(override, f.name) for f in fields(self)
                   if f.name != "extra" and getattr(override, f.name) is not None}
        return replace(self, **changes, extra=self.extra + override.extra)

    def sbatch_lines(self, nodes: int) -> list[str]:
        """The `#SBATCH` lines of a batch script (one task, the host-side runner, per node)."""
        opts: list[tuple[str, Any]] = [
            ("partition", self.partition), ("account", self.account), ("qos", self.qos),
            ("time", self.time), ("nodes", nodes), ("ntasks-per-node", 1),
            ("gpus-per-node", self.gpus_per_node), ("cpus-per-task", self.cpus_per_task),
            ("mem", self.mem)]
        lines = [f"#SBATCH --{k}={v}" for k, v in opts if v is not None]
        return lines + [f"#SBATCH {x}" for x in self.extra]


def time_problem(value: str) -> str | None:
    """Why value is not a Slurm time limit, or None (as sbatch --time reads it)."""
    if value.lower() in ("infinite", "unlimited"):
        return None
    for form in _TIME_FORMS:
        m = form.match(value)
        if m:
            parts = m.groupdict()
            lead = "d" if parts.get("d") else "h" if parts.get("h") else "m"
            for key, top in (("h", 24), ("m", 60), ("s", 60)):
                v = parts.get(key)
                if v is not None and key != lead and int(v) >= top:
                    return f"{key} field {v} is out of range (below {top})"
            return None
    return "not MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"


def parse_scheduler(value: Any, file: Path, where: str) -> str:
    if value is None:
        return "ssh"
    if value not in SCHEDULERS:
        raise ConfigError(f"{file}: [{where}.scheduler] expected one of "
                          f"{', '.join(repr(s) for s in SCHEDULERS)}, got {value!r}")
    return str(value)


def parse_slurm(table: Any, file: Path, where: str,
                allowed: tuple[str, ...] = KEYS) -> SlurmOptions:
    """A `[...slurm]` table; where: e.g. `hosts.cluster.slurm`."""
    def fail(key: str, expected: str, got: Any = None) -> ConfigError:
        at = f"{where}.{key}" if key else where
        tail = f", got {got!r}" if got is not None else ""
        return ConfigError(f"{file}: [{at}] expected {expected}{tail}")

    if not isinstance(table, dict):
        raise fail("", "a table", table)
    for k in table:
        if k not in allowed:
            raise fail(k, "one of the keys " + ", ".join(allowed) + f" (unknown key {k!r})")
    out: dict[str, Any] = {}
    for key in ("partition", "account", "qos"):
        v = table.get(key)
        if v is not None and (not isinstance(v, str) or not _NAME.match(v)):
            raise fail(key, "a Slurm name (letters, digits, _ . , + -)", v)
        out[key] = v
    t = table.get("time")
    if t is not None:
        why = time_problem(t) if isinstance(t, str) else "a string"
        if why is not None:
            raise fail("time", f"a Slurm time limit ({why})", t)
    out["time"] = t
    for key in ("gpus_per_node", "cpus_per_task"):
        v = table.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise fail(key, "a positive integer", v)
        out[key] = v
    mem = table.get("mem")
    if mem is not None and (not isinstance(mem, str) or not _MEM.match(mem)):
        raise fail("mem", "a memory size like 64G or 500000 (megabytes)", mem)
    out["mem"] = mem
    extra = table.get("extra", [])
    if isinstance(extra, str):
        extra = [extra]
    if not isinstance(extra, list) or not all(
            isinstance(x, str) and x.startswith("-") and "\n" not in x and "\r" not in x
            for x in extra):
        raise fail("extra", "a list of sbatch options, each starting with '-', one line each",
                   extra)
    out["extra"] = tuple(extra)
    conf = table.get("conf")
    if conf is not None and (not isinstance(conf, str) or not conf):
        raise fail("conf", "a path to slurm.conf", conf)
    out["conf"] = conf
    return SlurmOptions(**out)


def missing(opts: SlurmOptions) -> list[str]:
    """The required options that are not set."""
    return [k for k in REQUIRED if getattr(opts, k) is None]
