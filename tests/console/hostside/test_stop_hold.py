"""A command that must finish a cleanup holds `stop`'s SIGKILL off (engine/stop_hold.py writes
the hold in the run directory the runner names; console/hostside/runner.py waits for it): a
real runner, a command that cleans up on SIGTERM for longer than the grace. The stop waits for
the cleanup and says so; a hold that passes is cut by SIGKILL and what it left undone is a
warning (exit status 1); a hold file that is not one is ignored."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from console.cli import main as cli_main
from tests.paths import REPO
from tests.waiting import wait_until

# on SIGTERM: ask for HOLD seconds, clean up for WORK seconds, say so, exit 0
COMMAND = """import os, sys, time, signal
sys.path.insert(0, {repo!r})
from engine import stop_hold
hold, work, fake = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
def cleanup(*_):
    if fake != "ahead":
        stop_hold.hold(hold, "cleaning up", "the cleanup did not finish: do it by hand")
    time.sleep(work)
    stop_hold.release()
    print("cleaned", flush=True)
    os._exit(0)
signal.signal(signal.SIGTERM, cleanup)
if fake == "ahead":  # asked before any stop: the time counts from the stop's SIGTERM
    stop_hold.hold(hold, "cleaning up", "the cleanup did not finish", from_stop=True)
if fake == "fifo":
    os.mkfifo(os.path.join(os.environ["EAGLE3_RUN_DIR"], "stop-hold.json"))
elif fake == "junk":
    with open(os.path.join(os.environ["EAGLE3_RUN_DIR"], "stop-hold.json"), "w") as f:
        f.write('{{"until": 1e999, "why": ' + '[' * 100000)
if fake in ("fifo", "junk"):  # not written as a hold: nothing holds the kill off
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(300)
"""


def config(tmp: Path, hold: float, work: float, fake: str = "-") -> Path:
    script = tmp / "cleaner.py"
    script.write_text(COMMAND.format(repo=str(REPO)))
    cfg = tmp / "config.toml"
    cfg.write_text(f'[hosts.box]\npython = "{sys.executable}"\nroot = "{tmp / "root"}"\n'
                   f'[profiles.job]\nhost = "box"\nrun = "python {script} {hold} {work} '
                   f'{fake}"\n')
    return cfg


def start(cfg: Path, tmp: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, Path]:
    assert cli_main(["--config", str(cfg), "launch", "job"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    run_dir = next((tmp / "root" / "runs").iterdir())
    wait_until(lambda: "ready" in (run_dir / "output.log").read_text(errors="replace"),
               what="the command ready")
    return run_dir.name, run_dir


@pytest.mark.parametrize("fake", ["-", "ahead"])
def test_stop_waits_for_a_held_cleanup(tmp_path: Path, fake: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    cfg = config(tmp_path, hold=30, work=3, fake=fake)
    run_id, run_dir = start(cfg, tmp_path, capsys)
    t0 = time.monotonic()
    assert cli_main(["--config", str(cfg), "stop", run_id, "--grace", "0.5"]) == 0
    said = capsys.readouterr().out
    assert time.monotonic() - t0 >= 3
    assert "cleaned" in (run_dir / "output.log").read_text()
    assert said.startswith(f"{run_id} on box: stopped (exit 0) after cleaning up (waited "), said
    assert not (run_dir / "stop-hold.json").exists()


def test_a_hold_that_passes_is_cut_and_what_it_left_is_said(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = config(tmp_path, hold=2, work=60)
    run_id, run_dir = start(cfg, tmp_path, capsys)
    t0 = time.monotonic()
    assert cli_main(["--config", str(cfg), "stop", run_id, "--grace", "0.5"]) == 1
    took = time.monotonic() - t0
    said = capsys.readouterr()
    assert 2 <= took < 30
    assert f"stopped (exit {-signal.SIGKILL})" in said.out
    assert said.err.strip() == (f"warning: {run_id} on box: the cleanup did not finish: do it "
                                "by hand")
    assert "cleaned" not in (run_dir / "output.log").read_text()


@pytest.mark.parametrize("fake", ["fifo", "junk"])
def test_a_hold_file_that_is_not_one_is_ignored(tmp_path: Path, fake: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    cfg = config(tmp_path, hold=30, work=30, fake=fake)
    run_id, run_dir = start(cfg, tmp_path, capsys)
    t0 = time.monotonic()
    assert cli_main(["--config", str(cfg), "stop", run_id, "--grace", "0.5"]) == 0
    assert time.monotonic() - t0 < 15
    assert f"stopped (exit {-signal.SIGKILL})" in capsys.readouterr().out
