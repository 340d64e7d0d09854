"""The two halves stay apart: the console runs without torch, the engine without
textual/asyncssh."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _py(code: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_console_app_starts_without_importing_torch(tmp_path: Path) -> None:
    r = _py("""
        import asyncio, sys
        from console.cli import build_parser
        build_parser()                          # every subcommand module imported
        from console.app import create_app
        from console.settings.config import default_config
        async def main():
            app = create_app(default_config())
            async with app.run_test(size=(120, 40)) as pilot:
                await pilot.pause()
                await pilot.press("q")
        asyncio.run(main())
        heavy = sorted(m for m in sys.modules
                       if m.split('.')[0] in ('torch', 'transformers', 'safetensors'))
        print('HEAVY', heavy)
        assert not heavy, heavy
    """, {"XDG_CONFIG_HOME": str(tmp_path / "c"), "XDG_DATA_HOME": str(tmp_path / "d")})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "HEAVY []" in r.stdout


def test_engine_imports_no_textual_or_asyncssh() -> None:
    r = _py("""
        import sys, importlib, pkgutil
        import engine, engine.cli
        engine.cli.build_parser()               # every command module imported
        for m in pkgutil.walk_packages(engine.__path__, 'engine.'):
            if m.name != 'engine.__main__':      # that one runs the CLI
                importlib.import_module(m.name)
        bad = sorted(m for m in sys.modules
                     if m.split('.')[0] in ('textual', 'asyncssh', 'console'))
        print('BAD', bad)
        assert not bad, bad
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "BAD []" in r.stdout


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
