"""The console's CLI in tests: called in this process (its exit code and what it printed), or run
as a real `python -m console` process on this checkout with private XDG directories."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from console.cli import main as cli_main
from tests.paths import REPO


def cli(capsys: pytest.CaptureFixture[str], cfg: Path, *args: str) -> tuple[int, str, str]:
    """`eagle3-console --config CFG ARGS` in this process: (exit code, stdout, stderr)."""
    code = cli_main(["--config", str(cfg), *args])
    out, err = capsys.readouterr()
    return code, out, err


def console_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a `python -m console` subprocess: this checkout, private XDG dirs."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    for var, sub in (("XDG_CONFIG_HOME", "xdg-config"), ("XDG_DATA_HOME", "xdg-data"),
                     ("XDG_CACHE_HOME", "xdg-cache")):
        env[var] = str(tmp_path / sub)
    return env


def console(tmp_path: Path, *args: str, cwd: Path | None = None, timeout: float = 60
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "console", *args], capture_output=True,
                          text=True, env=console_env(tmp_path), cwd=cwd or tmp_path,
                          timeout=timeout)
