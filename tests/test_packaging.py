"""An installed (non-editable) wheel carries everything the console needs at run time: the
theme styles and palettes, and the host-side helpers it pushes to servers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


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
