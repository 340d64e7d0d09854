"""`engine doctor` on a GPU server whose Python lacks torch: it still answers, and says so (the
other commands import torch inside `run`, so the CLI itself never needs it), with the command
that fixes it; `eagle3-console doctor` then exits 1, and says where it pushed the engine."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.paths import REPO


def _no_torch(tmp_path: Path) -> None:
    """Simulate a fresh GPU server whose Python lacks torch: an import hook refuses it."""
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent("""
        import sys
        class _NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] in ('torch', 'transformers', 'safetensors'):
                    raise ImportError(f"No module named {name!r}")
        sys.meta_path.insert(0, _NoTorch())
    """))


def test_engine_doctor_reports_missing_torch(tmp_path: Path) -> None:
    _no_torch(tmp_path)
    import os
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}")
    r = subprocess.run([sys.executable, "-m", "engine", "doctor"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "torch      not importable" in r.stdout
    assert f"PROBLEM    torch is installed but not importable (ImportError: No module named " \
           f"'torch'): reinstall it with `{sys.executable} -m pip install --force-reinstall " \
           "torch`" in r.stdout
    r = subprocess.run([sys.executable, "-m", "engine", "doctor", "--events"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    from engine.events import parse
    evs = [parse(line) for line in r.stdout.splitlines()]
    assert evs and all(e is not None for e in evs)
    result = [e for e in evs if e.kind == "result"][0]
    assert result.data["torch"]["available"] is False


def test_console_doctor_exits_1_on_a_host_that_cannot_run_the_engine(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from console.cli import main as cli_main

    hook = tmp_path / "hook"
    hook.mkdir()
    _no_torch(hook)
    wrapper = tmp_path / "python-without-torch"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="$PYTHONPATH:{hook}" exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.bare]\npython = "{wrapper}"\nroot = "{tmp_path / "root"}"\n'
                   f'[hosts.good]\npython = "{sys.executable}"\nroot = "{tmp_path / "root"}"\n')
    assert cli_main(["--config", str(cfg), "doctor", "bare"]) == 1
    rows = {ln.split(maxsplit=1)[0]: ln.split(maxsplit=1)[1]
            for ln in capsys.readouterr().out.splitlines()[1:] if not ln.startswith(" ")}
    assert rows["PROBLEM"].startswith("torch is installed but not importable")
    assert rows["engine"].startswith(f"pushed to {tmp_path / 'root'}") and "files sent" in \
        rows["engine"]
    assert "vllm" in rows
    assert cli_main(["--config", str(cfg), "doctor", "good"]) == 0
    out = capsys.readouterr().out
    assert "PROBLEM" not in out and "(up to date, manifest " in out
