"""`engine doctor` on a GPU server whose Python lacks torch: it still answers, and says so (the
other commands import torch inside `run`, so the CLI itself never needs it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_engine_doctor_reports_missing_torch(tmp_path: Path) -> None:
    # Simulate a fresh GPU server whose Python lacks torch: an import hook refuses it.
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent("""
        import sys
        class _NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] in ('torch', 'transformers', 'safetensors'):
                    raise ImportError(f"No module named {name!r}")
        sys.meta_path.insert(0, _NoTorch())
    """))
    import os
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}")
    r = subprocess.run([sys.executable, "-m", "engine", "doctor"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "torch      not importable" in r.stdout
    r = subprocess.run([sys.executable, "-m", "engine", "doctor", "--events"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    from engine.events import parse
    evs = [parse(line) for line in r.stdout.splitlines()]
    assert evs and all(e is not None for e in evs)
    result = [e for e in evs if e.kind == "result"][0]
    assert result.data["data"]["torch"]["available"] is False
