"""What a script and a person see of a run's outcome, through the CLI
as a subprocess against the real test sshd: `launch` exits 1 when its process failed at once,
`follow` exits with the run's outcome (0 succeeded, 1 failed, 3 stopped) and prints the reason
the runner recorded and the engine's error once; across dropped connections each file's resume
is named once; a host down while follow looks the run up is waited for; a long command in an
error is cut between words, never inside a path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from console.errors import CommandFailed
from console.transport.ssh import SSHTransport
from tests.paths import REPO
from tests.sshd import SSHD, start_sshd
from tests.waiting import wait_until

PROFILES = {
    "quick": "python -c 'import sys; print(\"about to fail\"); sys.exit(3)'",
    "missing": "no-such-program-xyz --flag",
    "fine": "python -c 'print(\"done\")'",
    "sleepy": "python -c 'import time; time.sleep(60)'",
    "engerr": "engine inspect {run_dir}/no-such-drafter",
    # 40 ticks, then it ends only once the test says so (a `go` file): the drops land while
    # the run is live however slowly a loaded machine starts the follower
    "ticks": "python -c 'import os, time\nfor i in range(40):\n    print(\"tick\", i, flush=True); "
             "time.sleep(0.25)\nwhile not os.path.exists(\"{run_dir}/go\"):\n    time.sleep(0.1)'",
}


@pytest.fixture
def config(sshd: SSHD, tmp_path: Path) -> Path:
    return write_config(sshd, tmp_path)


def write_config(sshd: SSHD, tmp_path: Path) -> Path:
    text = (f'[hosts.box]\nssh = "{sshd.target}"\nknown_hosts = "{sshd.known_hosts}"\n'
            f'identity = "{sshd.user_key}"\npython = "{sys.executable}"\n'
            f'root = "{tmp_path / "root"}"\n')
    for name, run in PROFILES.items():
        text += f'[profiles.{name}]\nhost = "box"\nrun = {json.dumps(run)}\n'
    p = tmp_path / "config.toml"
    p.write_text(text)
    return p


def cli(config: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "console", "--config", str(config), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def launched(config: Path, profile: str) -> tuple[str, subprocess.CompletedProcess[str]]:
    r = cli(config, "launch", profile)
    return (r.stdout.split() or [""])[0], r


@pytest.mark.slow
def test_launch_and_follow_exit_with_the_outcome(config: Path) -> None:
    rid, r = launched(config, "quick")
    assert r.returncode == 1, r
    assert f"error: run {rid} failed at once" in r.stderr and "exit 3" in r.stdout
    r = cli(config, "follow", rid)
    assert (r.returncode, r.stdout) == (1, "about to fail\n")
    assert f"-- run {rid} failed, exit 3" in r.stderr

    r = cli(config, "launch", "missing")
    assert r.returncode == 1 and "cannot run no-such-program-xyz" in r.stderr
    runs = json.loads(cli(config, "runs", "box", "--json").stdout)
    rid = next(x["id"] for x in runs if x["profile"] == "missing")
    r = cli(config, "follow", rid)   # the runner's recorded reason, not only the exit code
    assert r.returncode == 1
    assert (f"-- run {rid} failed, exit 127: cannot run no-such-program-xyz: No such file or "
            "directory") in r.stderr

    rid, r = launched(config, "fine")
    assert r.returncode == 0, r
    r = cli(config, "follow", rid)
    assert (r.returncode, r.stdout) == (0, "done\n")

    rid, r = launched(config, "sleepy")
    assert r.returncode == 0 and "running" in r.stdout, r
    assert cli(config, "stop", rid, "--grace", "5").returncode == 0
    r = cli(config, "follow", rid)
    assert r.returncode == 3 and f"-- run {rid} stopped" in r.stderr


def test_follow_prints_the_engines_error_once(config: Path) -> None:
    rid, _ = launched(config, "engerr")
    r = cli(config, "follow", rid)
    assert r.returncode == 1
    errors = [ln for ln in r.stdout.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and errors[0].endswith("no-such-drafter: does not exist"), r.stdout


def test_follow_names_the_file_it_resumes(config: Path, sshd: SSHD) -> None:
    rid, r = launched(config, "ticks")
    assert r.returncode == 0, r
    env = dict(os.environ, PYTHONPATH=str(REPO))
    follow = subprocess.Popen([sys.executable, "-m", "console", "--config", str(config),
                               "follow", rid], cwd=REPO, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert follow.stdout is not None
    first = follow.stdout.readline()   # following: from here on only the follower reconnects
    drops = 0
    for _ in range(4):   # the run cannot end before `go`: the follower is live for each drop
        assert follow.poll() is None
        drops += sshd.drop_connections() > 0
        time.sleep(1.5)
    (config.parent / "root" / "runs" / rid / "go").touch()
    # read through the same buffered pipe: communicate() reads the raw descriptor and would
    # miss what readline() buffered ahead (lines written before the first drop)
    rest = follow.stdout.read()
    assert follow.stderr is not None
    err = follow.stderr.read()   # a few notices: cannot fill the pipe while stdout is read
    follow.wait(timeout=60)
    out = first + rest
    assert drops >= 1
    assert out.splitlines() == [f"tick {i}" for i in range(40)]   # none lost, none twice
    # a drop between two reads is healed by the transport unseen; one that cuts a read is
    # noticed, and then names the file (the wording itself: test_notices_name_the_file)
    resumed = [ln for ln in err.splitlines() if ln.startswith("-- reconnected")]
    assert all(ln.startswith("-- reconnected: output.log: resuming at byte ") for ln in resumed)
    assert len(resumed) == len(set(resumed)) or drops > 1, err
    assert follow.returncode == 0


def test_follow_waits_for_a_host_that_is_down_while_it_looks_up_the_run(tmp_path: Path) -> None:
    """`launch && follow` as the host blips: follow looks the run up again with the followers'
    backoff and notices until the host answers, then follows it to its outcome; a run id that
    an answering host does not have still fails at once."""
    own = start_sshd(tmp_path / "sshd")   # its own server: this test stops it
    try:
        config = write_config(own, tmp_path)
        rid, r = launched(config, "fine")
        assert r.returncode == 0, r
        wait_until(lambda: json.loads(cli(config, "runs", "box", "--json").stdout)[0]["status"]
                   == "succeeded", timeout=60, what="the run to end")
        own.stop()
        env = dict(os.environ, PYTHONPATH=str(REPO))
        follow = subprocess.Popen([sys.executable, "-m", "console", "--config", str(config),
                                   "follow", rid], cwd=REPO, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        watchdog = threading.Timer(120, follow.kill)   # a hang fails, never blocks the suite
        watchdog.start()
        try:
            assert follow.stderr is not None
            first = follow.stderr.readline()   # the lookup could not ask the host: it waits
            assert first.startswith("-- reconnecting: box: "), first
            assert follow.poll() is None
            own.restart()
            out, err = follow.communicate(timeout=90)
        finally:
            watchdog.cancel()
        assert (follow.returncode, out) == (0, "done\n"), (first, err)
        assert f"-- reconnected: run {rid} found on box" in err

        started = time.monotonic()
        r = cli(config, "follow", "fine-no-such-run")
        assert (r.returncode, r.stderr) == (1, "error: no run 'fine-no-such-run' on any "
                                               "configured host\n")
        assert time.monotonic() - started < 30   # at once: one lookup, no backoff
    finally:
        own.stop()


def test_notices_name_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    """follow's notices: the connection's `reconnecting` once for both
    files, each file's `reconnected` naming it and the byte it resumes at."""
    from console.commands.follow import Notices
    notices = Notices()
    out, events = notices.of("output.log"), notices.of("events.jsonl")
    out("reconnecting", "box: connection lost")
    events("reconnecting", "box: connection lost")
    out("reconnected", "resuming at byte 0")
    events("reconnected", "resuming at byte 812")
    assert capsys.readouterr().err.splitlines() == [
        "-- reconnecting: box: connection lost",
        "-- reconnected: output.log: resuming at byte 0",
        "-- reconnected: events.jsonl: resuming at byte 812"]


async def test_a_long_command_in_an_error_keeps_its_paths_whole(sshd: SSHD,
                                                                 tmp_path: Path) -> None:
    deep = "/".join(["a-rather-long-folder-name"] * 8) + "/output.log"
    t = SSHTransport("box", sshd.target, known_hosts=str(sshd.known_hosts),
                     identity=str(sshd.user_key))
    async with t:
        with pytest.raises(CommandFailed) as e:
            await t.run(["tail", "-c", "+1", f"{tmp_path}/{deep}"], check=True)
        with pytest.raises(CommandFailed) as many:
            await t.run(["ls", *[f"{tmp_path}/{deep}-{i}" for i in range(4)]], check=True)
    assert f"`tail -c +1 {tmp_path}/{deep}` exited 1" in str(e.value)
    msg = str(many.value)
    assert f"`ls {tmp_path}/{deep}-0 … (3 more)` exited 2" in msg
