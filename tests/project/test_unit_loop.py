"""The unit loop's rule and guard (tests/unit_loop.py): the rule follows a test's code through
the tests/ helpers it calls to a process, an app or the console's hosts, and leaves such a test
out; the guard fails a test under --unit that starts a process where the rule cannot see it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

from tests.paths import REPO
from tests.unit_loop import starts

PROBE = '''
import asyncio, subprocess
from console.cli import main as cli_main

def spawns():
    subprocess.run(["true"])

def calls_a_helper_that_spawns():
    return [spawns() for _ in range(1)]

def imports_the_cli_inside():
    from console.cli import main
    return main

def runs_an_app(app):
    return app.run_test()

async def starts_an_asyncio_process():
    await asyncio.create_subprocess_exec("true")

def asks_for_sshd(request):
    return request.getfixturevalue("sshd")

def pure(x):
    return {"transport": x, "system": "sshd"}
'''


def probe() -> dict[str, Any]:
    """PROBE's functions, in a module the rule counts as a test helper (under tests.)."""
    module = types.ModuleType("tests.unit_probe")
    exec(compile(PROBE, "tests/unit_probe.py", "exec"), module.__dict__)
    return module.__dict__


@pytest.mark.parametrize("name,what", [
    ("spawns", "a process (through subprocess)"),
    ("calls_a_helper_that_spawns", "a process (through subprocess)"),
    ("imports_the_cli_inside", "a host (through console.cli)"),
    ("runs_an_app", "a Textual app (run_test)"),
    ("starts_an_asyncio_process", "a process (create_subprocess_exec)"),
    ("asks_for_sshd", "a component (the sshd fixture)"),
    ("pure", None),
])
def test_the_rule_follows_code_to_what_it_starts(name: str, what: str | None) -> None:
    assert starts(probe()[name]) == what


SUITE = '''
import subprocess
import pytest

def test_pure():
    assert sum([1, 2]) == 3

def test_seen():
    subprocess.run(["true"])

def test_hidden():
    getattr(__import__("subprocess"), "run")(["true"])

@pytest.mark.component
def test_marked():
    getattr(__import__("subprocess"), "run")(["true"])
'''


@pytest.mark.component
def test_the_guard_fails_a_process_the_rule_cannot_see(tmp_path: Path) -> None:
    (tmp_path / "test_probe.py").write_text(textwrap.dedent(SUITE))
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.unit_loop", "--unit",
                        "-q", "-p", "no:cacheprovider", "test_probe.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert "1 failed, 1 passed, 2 deselected" in p.stdout, p.stdout + p.stderr
    assert "FAILED test_probe.py::test_hidden" in p.stdout
    assert "not a unit test: it started a process (subprocess.Popen" in p.stdout
