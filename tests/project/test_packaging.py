"""An installed (non-editable) wheel carries everything the console needs at run time: the
theme styles and palettes, the host-side helpers it pushes to servers (the shell script of
the monitor fallback among them: package data, not a module), and the demo's recorded vLLM log
that `engine demo init` copies into the workspace."""

from __future__ import annotations

import os
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
        import console.hostside.slurm_job, console.hostside.run_records
        import console.hostside.checkpoint_scan as scan, console.monitor.nvidia_smi as smi
        here = resources.files("console.hostside")
        assert str(here).startswith(sys.argv[1]), here
        for name in ("runner.py", "slurm_job.py", "run_records.py", "checkpoint_scan.py",
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
