"""Safety of detached runs: stop signals only what it started (PID plus start time),
a run that cannot be recorded never starts, secrets in a profile's env stay off disk and run
records are private, a truncated bytecode cache cannot break the host-side runner, a corrupt
record does not break the registry, and concurrent launches of one profile start one run.

Real processes, real files, the real runner (through the test sshd where it matters)."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import py_compile
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from console.errors import ConsoleError
from console.hosts.engine_client import ensure_engine
from console.hosts.host import HostPool
from console.runs.service import launch, list_runs, stop_run
from console.scheduler.run_record import RunRecord
from console.settings.config import Profile
from console.widgets.run_tables import run_row
from tests.console_cli import cli
from tests.detached_runs import local_toml, make_config, wait_status
from tests.sshd import SSHD

SECRETS = {"HF_TOKEN": "hf_SeCrEt-1", "WANDB_API_KEY": "wandb-SeCrEt-2",
           "db_password": "pw-SeCrEt-3", "My_Secret_Thing": "SeCrEt-4"}


@pytest.fixture(params=["local", "ssh"])
def server(request: pytest.FixtureRequest) -> SSHD | None:
    """Each test twice: on the local transport and through the real test sshd."""
    return request.getfixturevalue("sshd") if request.param == "ssh" else None


def proc_start(pid: int) -> int:
    data = Path(f"/proc/{pid}/stat").read_text()
    return int(data[data.rindex(")") + 2:].split()[19])


def write_record(root: Path, run_id: str, **fields: object) -> Path:
    run_dir = root / "runs" / run_id
    run_dir.mkdir(parents=True)
    rec = {"id": run_id, "profile": run_id.split("-")[0], "host": "box", "node_rank": 0,
           "nnodes": 1, "argv": ["sleep", "300"], "env": {}, "run_dir": str(run_dir),
           "status": "running", "exit_code": None, "start": time.time() - 60, "end": None}
    rec.update(fields)
    (run_dir / "run.json").write_text(json.dumps(rec))
    return run_dir


# -- 1. stop signals only a process whose start time matches the record -----------------------

async def test_stop_never_signals_a_reused_pid(server: SSHD | None, tmp_path: Path) -> None:
    """The run's command and monitor are gone and their pid now leads a stranger's session:
    stop leaves the stranger alone and says the run is lost."""
    cfg = make_config(server, tmp_path, {"ghost": Profile(name="ghost", hosts=["box"],
                                                          run="sleep 300")})
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        wrong = proc_start(stranger.pid) + 17   # what a long-dead run of ours recorded
        run_id = "ghost-20260101-000000-abcd"
        run_dir = write_record(Path(cfg.hosts["box"].root), run_id, pid=stranger.pid,
                               pgid=stranger.pid, pid_start=wrong, monitor_pid=stranger.pid,
                               monitor_start=wrong)
        # a record without start times cannot prove anything either (list said `running`)
        unproven = "ghost-20260101-000000-ef01"
        write_record(Path(cfg.hosts["box"].root), unproven, pid=stranger.pid,
                     pgid=stranger.pid, pid_start=None, monitor_pid=None)
        pool = HostPool(cfg)
        try:
            listed = await list_runs(pool["box"])
            assert [(r.id, r.status) for r in listed] == [(run_id, "lost"), (unproven, "lost")]
            stopped = await stop_run(cfg, run_id, pool, grace=0.5)
            again = await stop_run(cfg, unproven, pool, grace=0.5)
        finally:
            await pool.close()
        assert stranger.poll() is None, "stop signalled a process it did not start"
        assert [r.status for r in stopped.records + again.records] == ["lost", "lost"]
        assert "not signalled" in stopped.records[0].refused
        assert not (run_dir / "stop").exists()
        assert json.loads((run_dir / "run.json").read_text())["status"] == "running"
    finally:
        stranger.kill()
        stranger.wait()


def test_stop_command_reports_lost_run(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        cfg = local_toml(tmp_path, '[profiles.ghost]\nhost = "box"\nrun = "sleep 300"\n')
        run_id = "ghost-20260101-000000-abcd"
        write_record(tmp_path / "host root", run_id, pid=stranger.pid, pgid=stranger.pid,
                     pid_start=proc_start(stranger.pid) - 1, monitor_pid=None)
        code, out, err = cli(capsys, cfg, "stop", run_id)
        assert code == 1
        assert err.count("\n") == 1 and "lost" in err and "not signalled" in err, err
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


# -- 3. a run that cannot be recorded never starts ------------------------------------------

WRAPPER = """#!{python}
# the host's python, with a file size limit for the runner's `start` (a disk that fills up
# between spec.json and run.json); the limit applies to root too
import os, resource, sys
limit = {limit!r}
if os.path.exists(limit) and "start" in sys.argv:
    n = int(open(limit).read())
    resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))
os.execv({python!r}, [{python!r}] + sys.argv[1:])
"""


def test_unrecordable_run_does_not_start(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    limit = tmp_path / "fsize-limit"
    wrapper = tmp_path / "python-limited"
    wrapper.write_text(WRAPPER.format(python=sys.executable, limit=str(limit)))
    wrapper.chmod(0o755)
    marker = tmp_path / "it-ran"
    script = tmp_path / "cmd.py"
    script.write_text("import pathlib, sys, time\nif sys.argv[1] == 'y':\n"
                      f"    pathlib.Path({str(marker)!r}).write_text('ran')\n"
                      "    time.sleep(300)\n")
    cfg = local_toml(tmp_path, f'[profiles.p1]\nhost = "box"\nrun = "python {script} x"\n'
                     f'[profiles.p2]\nhost = "box"\nrun = "python {script} y"\n',
                     python=str(wrapper))
    runs = tmp_path / "host root" / "runs"
    # p1 has records of exactly p2's sizes: put the limit between spec.json and run.json
    code, out, err = cli(capsys, cfg, "launch", "p1")
    assert code == 0, err
    (first,) = list(runs.iterdir())
    spec_size = (first / "spec.json").stat().st_size
    record_size = (first / "run.json").stat().st_size
    assert record_size - spec_size > 100
    limit.write_text(str((spec_size + record_size) // 2))

    code, out, err = cli(capsys, cfg, "launch", "p2")
    assert code == 1
    assert err.count("\n") == 1 and "not started" in err, err
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and not marker.exists():
        time.sleep(0.05)
    alive = [p for p in psutil.process_iter(["cmdline"])
             if str(script) in (p.info["cmdline"] or [])]
    for p in alive:
        p.kill()
    assert not marker.exists() and not alive, "the command ran without a record"
    # nothing half-written is left: the failed run's directory is gone
    assert [d.name for d in runs.iterdir()] == [first.name]
    limit.unlink()
    code, out, err = cli(capsys, cfg, "runs", "box", "--json")
    assert code == 0 and [r["profile"] for r in json.loads(out)] == ["p1"]


# -- 4. secrets stay off disk; run directories are private ------------------------------------

async def test_secrets_masked_and_records_private(server: SSHD | None, tmp_path: Path) -> None:
    script = tmp_path / "env.py"
    script.write_text("import hashlib, json, os\nprint(json.dumps({k: hashlib.sha256("
                      f"os.environ[k].encode()).hexdigest() for k in {sorted(SECRETS)!r}}}))\n"
                      "print(os.environ['GREETING'])\n")
    env = {**SECRETS, "GREETING": "hello"}
    cfg = make_config(server, tmp_path, {"sec": Profile(name="sec", hosts=["box"],
                                                        run=f"python {script}", env=env)})
    pool = HostPool(cfg)
    try:
        run = await launch(cfg, "sec", pool)
        rec = await wait_status(pool["box"], run.id, {"succeeded", "failed"})
    finally:
        await pool.close()
    run_dir = Path(rec.run_dir)
    out = (run_dir / "output.log").read_text().splitlines()
    assert rec.status == "succeeded", out
    # the process saw the real values
    assert json.loads(out[0]) == {k: hashlib.sha256(v.encode()).hexdigest()
                                  for k, v in SECRETS.items()}
    assert out[1] == "hello"
    # the records say *** for them, and only for them
    for name in ("run.json", "spec.json"):
        written = json.loads((run_dir / name).read_text())["env"]
        assert written == {**{k: "***" for k in SECRETS}, "GREETING": "hello",
                           "PYTHONUNBUFFERED": "1"}, name
    assert rec.env["HF_TOKEN"] == "***"
    # no secret in any file of the run; the directory and its files are the user's only
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    files = sorted(p.name for p in run_dir.iterdir())
    assert {"run.json", "spec.json", "output.log", "runner.log"} <= set(files)
    for p in run_dir.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p.name
        data = p.read_bytes()
        assert not any(v.encode() in data for v in SECRETS.values()), p.name


# -- 6. a truncated bytecode cache cannot break the runner ------------------------------------

def test_truncated_pycache_does_not_break_runner(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cfg = local_toml(tmp_path, '[profiles.nap]\nhost = "box"\nrun = "sleep 300"\n')
    code, out, err = cli(capsys, cfg, "runs", "box")   # pushes the runner
    assert code == 0, err
    pkg = tmp_path / "host root" / "code" / "eagle3_hostside"
    for src in (pkg / "runner.py", pkg / "__init__.py"):
        # a cache file Python accepts (source mtime and size match) cut short, as a full
        # disk leaves it
        pyc = Path(importlib.util.cache_from_source(str(src)))
        py_compile.compile(str(src), cfile=str(pyc), doraise=True)
        pyc.write_bytes(pyc.read_bytes()[:20])
    code, out, err = cli(capsys, cfg, "runs", "box")
    assert code == 0 and "no runs on box" in out, err
    code, out, err = cli(capsys, cfg, "launch", "nap")
    assert code == 0, err
    run_id = out.splitlines()[0]
    code, out, err = cli(capsys, cfg, "stop", run_id, "--grace", "2")
    assert code == 0 and f"{run_id} on box: stopped" in out, err


# -- 7. a corrupt record is listed as corrupt; the rest of the registry works -----------------

BAD = {
    "bad-20260101-000000-0001": ('{"id": "bad-20260101-000000-0001", "profile": "bad", '
                                 '"status": "running", "pid": "abc", "pgid": "abc"}', "pid"),
    "bad-20260101-000000-0002": ('{"id": "bad-20260101-000000-0002", "profile": "bad", '
                                 '"status": "running", "pid": 100000000000000000000000, '
                                 '"pgid": 1}', "pid"),
    "bad-20260101-000000-0003": ('{"id": "bad-20260101-000000-0003", "sta', "JSON"),
    "bad-20260101-000000-0004": ("[1, 2]", "object"),
    "bad-20260101-000000-0005": ('{"id": "bad-20260101-000000-0005", "profile": "bad", '
                                 '"status": "done", "start": 1e400}', "status"),
}


def test_corrupt_records_listed_and_launch_works(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cfg = local_toml(tmp_path, '[profiles.bad]\nhost = "box"\nrun = "true"\n')
    runs = tmp_path / "host root" / "runs"
    for run_id, (text, _) in BAD.items():
        (runs / run_id).mkdir(parents=True)
        (runs / run_id / "run.json").write_text(text)
    code, out, err = cli(capsys, cfg, "launch", "bad")
    assert code == 0, err
    good = out.splitlines()[0]
    code, out, err = cli(capsys, cfg, "runs", "box", "--json")
    assert code == 0, err
    recs = {r["id"]: r for r in json.loads(out)}
    assert set(recs) == {*BAD, good}
    assert recs[good]["status"] in ("running", "succeeded")
    for run_id, (_, reason) in BAD.items():
        assert recs[run_id]["status"] == "corrupt", run_id
        assert reason in recs[run_id]["error"], recs[run_id]["error"]
    code, out, err = cli(capsys, cfg, "runs", "box")
    assert code == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("bad-20260101-000000-0001"))
    assert "corrupt" in line and "pid" in line
    code, out, err = cli(capsys, cfg, "stop", "bad-20260101-000000-0002")
    assert code == 1 and err.count("\n") == 1 and "corrupt" in err, err


def test_console_parses_malformed_records_as_corrupt() -> None:
    for raw, reason in [
        ({"id": "a", "status": "running", "pid": "abc", "pgid": 5}, "pid"),
        ({"id": "a", "status": "succeeded", "exit_code": "0"}, "exit_code"),
        ({"id": "a", "status": "failed", "start": "yesterday"}, "start"),
        ({"id": "a", "status": "stopped", "nnodes": "two"}, "nnodes"),
        ({"id": "a", "status": "weird"}, "status"),
        ({"id": "a", "status": "succeeded", "push": "x"}, "push"),
    ]:
        rec = RunRecord.from_dict(raw, "box")
        assert rec.status == "corrupt" and reason in rec.error, (raw, rec.error)
        row = run_row(rec, None, time.time())
        assert "corrupt" in row[1] and reason in row[1]
    ok = RunRecord.from_dict({"id": "a", "status": "succeeded", "exit_code": 0, "start": 1.0,
                              "end": 2.0, "pid": 7, "pgid": 7}, "box")
    assert ok.status == "succeeded" and ok.error == ""


# -- 8. concurrent launches of one profile: exactly one starts --------------------------------

async def test_concurrent_launches_start_one(server: SSHD | None, tmp_path: Path) -> None:
    cfg = make_config(server, tmp_path, {"race": Profile(name="race", hosts=["box"],
                                                         run="sleep 300")})
    pools = [HostPool(cfg) for _ in range(3)]
    try:
        for pool in pools:   # connected and pushed: the launches meet at the start itself
            h = pool["box"]
            await h.connect()
            await ensure_engine(h)
        results = await asyncio.gather(*(launch(cfg, "race", p) for p in pools),
                                       return_exceptions=True)
        started = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, BaseException)]
        try:
            assert len(started) == 1, results
            assert all(isinstance(e, ConsoleError) and "already running" in str(e)
                       for e in refused), refused
            recs = await list_runs(pools[0]["box"])
            assert [(r.id, r.status) for r in recs] == [(started[0].id, "running")]
        finally:
            for run in started:
                await stop_run(cfg, run.id, pools[0], grace=2)
    finally:
        for pool in pools:
            await pool.close()
