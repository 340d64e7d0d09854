"""A real terminal: `eagle3-console` with no config file (the embedded demo default) in tmux,
driven by keys, read back from the captured screen. The demo workspace is the session's (linked
into the console's data directory, as a second start would find it)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.paths import REPO

pytest_plugins = ("tests.demo_workspace",)


TMUX = shutil.which("tmux")
pytestmark = [pytest.mark.skipif(TMUX is None, reason="tmux is not installed"),
              pytest.mark.slow]


class Term:
    """One tmux session on a private server socket."""

    def __init__(self, name: str) -> None:
        self.sock = f"eagle3-test-{os.getpid()}-{name}"
        self.target = name

    def tmux(self, *args: str, check: bool = True) -> str:
        assert TMUX is not None
        p = subprocess.run([TMUX, "-L", self.sock, "-f", "/dev/null", *args],
                           capture_output=True, text=True, timeout=30)
        if check and p.returncode != 0:
            raise AssertionError(f"tmux {args[0]}: {p.stderr}")
        return p.stdout

    def start(self, command: str, size: tuple[int, int] = (120, 40)) -> None:
        self.tmux("new-session", "-d", "-s", self.target, "-x", str(size[0]), "-y",
                  str(size[1]), command)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.target, check=False)

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", self.target, *keys)

    def alive(self) -> bool:
        return subprocess.run([TMUX or "tmux", "-L", self.sock, "has-session", "-t", self.target],
                              capture_output=True).returncode == 0

    def wait(self, text: str, timeout: float = 90.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if text in screen:
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} never appeared; screen:\n{screen}")
            time.sleep(0.3)

    def wait_gone(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while text in self.screen():
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} is still on screen:\n{self.screen()}")
            time.sleep(0.2)

    def kill(self) -> None:
        self.tmux("kill-server", check=False)


@pytest.fixture
def term() -> Iterator[Term]:
    t = Term("console")
    yield t
    t.kill()


def console_command(tmp_path: Path) -> str:
    exe = Path(sys.executable).parent / "eagle3-console"
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "console"]
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_DATA_HOME": str(tmp_path / "data"),
           "TERM": "xterm-256color", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    # COLUMNS / LINES (set by pytest's terminal handling) would pin the app's size
    words = [f"{k}={v}" for k, v in env.items()] + argv
    return "env -u COLUMNS -u LINES " + " ".join(shlex.quote(w) for w in words)


def test_demo_default_in_a_real_terminal(term: Term, demo_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "data" / "eagle3-console"
    data.mkdir(parents=True)
    (data / "demo").symlink_to(demo_dir, target_is_directory=True)
    term.start(console_command(tmp_path))
    # the demo opens on the runs pane with its two profiles
    term.wait("Demo workspace", timeout=120)
    screen = term.wait("t Launch")                           # the footer: this pane's keys
    assert "Runs" in screen and "finetune" in screen and "scratch" in screen
    assert "p Push" in screen and "x Stop" in screen and "R Resume" in screen
    term.keys("?")
    screen = term.wait("eagle3-console keys")
    assert "Runs pane" in screen
    term.keys("Escape")
    term.wait_gone("eagle3-console keys")   # (a key sent right after ESC would read as alt+key)
    # t: the finetune starts detached; x then y stops it
    term.keys("t")
    screen = term.wait("▶ running", timeout=180)
    assert "finetune-" in screen
    term.keys("x")
    term.wait("Stop it")
    term.keys("y")
    screen = term.wait("■ stopped", timeout=60)
    term.keys("q")
    deadline = time.monotonic() + 30
    while term.alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not term.alive(), term.screen()
    runs = list((data / "host" / "runs").iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("finetune-")
