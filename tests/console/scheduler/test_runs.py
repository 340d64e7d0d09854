"""Detached runs through the real test sshd (and the local transport): exit codes recorded
across a dropped connection, odd names and arguments, double launch, stop of a whole process
tree, lost runs, engine runs writing events.jsonl, and the subcommands."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from console.cli import main as cli_main
from console.errors import ConsoleError
from console.hosts.host import HostPool
from console.runs.service import launch, list_runs, stop_run
from console.scheduler.launch import LaunchHooks, NotStarted, build_argv
from console.scheduler.run_record import RunRecord
from console.scheduler.run_status import RunStatus, combined_status
from console.settings.config import HostConfig, Profile
from engine import events
from tests.detached_runs import make_config, wait_status
from tests.sshd import SSHD

ARGS_SCRIPT = ("import json, sys, os\nprint(json.dumps(sys.argv[1:]))\n"
               "print(os.environ['GREETING'])\nsys.stderr.write('to stderr\\n')\nsys.exit(3)\n")


@pytest.fixture(params=["local", "ssh"])
def server(request: pytest.FixtureRequest) -> SSHD | None:
    """Each test twice: on the local transport and through the real test sshd."""
    return request.getfixturevalue("sshd") if request.param == "ssh" else None


async def test_odd_names_args_exit_code_and_output(server: SSHD | None, tmp_path: Path) -> None:
    work = tmp_path / "work dir 'q'"
    work.mkdir()
    (work / "my script's.py").write_text(ARGS_SCRIPT)
    args = ["arg with space", 'q"uote', "$(touch pwned)", ";echo no", "`id`", "*", "a\\b"]
    run = "python \"my script's.py\" " + " ".join(shlex.quote(a) for a in args)
    cfg = make_config(server, tmp_path, {
        "odd": Profile(name="odd", hosts=["box"], run=run, cwd=str(work),
                       env={"GREETING": "hello; $HOME 'x'"})})
    pool = HostPool(cfg)
    try:
        started = await launch(cfg, "odd", pool)
        rec = await wait_status(pool["box"], started.id, {"failed"})
    finally:
        await pool.close()
    assert rec.exit_code == 3 and rec.end is not None and rec.end >= (rec.start or 0)
    out = (Path(rec.run_dir) / "output.log").read_text().splitlines()
    assert json.loads(out[0]) == args
    assert out[1] == "hello; $HOME 'x'"
    assert "to stderr" in out
    assert not (work / "pwned").exists()
    assert rec.push.manifest and rec.to_json()["push"]["trees"]["engine"]
    assert rec.argv[0] == sys.executable


async def test_run_survives_dropped_connection(sshd: SSHD, tmp_path: Path) -> None:
    marker = tmp_path / "done"
    script = tmp_path / "slow.py"
    script.write_text(f"import time, pathlib\ntime.sleep(2)\npathlib.Path({str(marker)!r})"
                      ".write_text('ok')\nprint('finished')\nraise SystemExit(7)\n")
    cfg = make_config(sshd, tmp_path, {
        "slow": Profile(name="slow", hosts=["box"], run=f"python {script}")})
    pool = HostPool(cfg)
    try:
        started = await launch(cfg, "slow", pool)
        assert started.status == "running"
        assert sshd.drop_connections() >= 1          # the launching connection is gone
        await pool["box"].close()
        # the run ends while no console is connected (polled: the script sleeps 2 s)
        deadline = time.monotonic() + 20
        while not marker.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert marker.read_text() == "ok"
        rec = await wait_status(pool["box"], started.id, {"failed"}, timeout=10)
    finally:
        await pool.close()
    assert rec.exit_code == 7
    assert (Path(rec.run_dir) / "output.log").read_text() == "finished\n"


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_double_launch_refused_and_stop_kills_children(server: SSHD | None,
                                                             tmp_path: Path) -> None:
    cfg = make_config(server, tmp_path, {
        "tree": Profile(name="tree", hosts=["box"], cwd=str(tmp_path),
                        run="sh -c 'sleep 300 & echo $! > child-$$.pid; wait'")})
    pool = HostPool(cfg)
    try:
        first = await launch(cfg, "tree", pool)
        with pytest.raises(ConsoleError, match="already running"):
            await launch(cfg, "tree", pool)
        # the runs pane's way: one call that asks (confirm hook) and reports its steps
        asked: list[list[str]] = []
        steps: list[str] = []

        async def answer(busy: list[RunRecord]) -> bool:
            asked.append([r.id for r in busy])
            return len(asked) > 1  # no, then yes

        hooks = LaunchHooks(confirm=answer, step=steps.append)
        with pytest.raises(NotStarted, match="not started: tree is already running"):
            await launch(cfg, "tree", pool, hooks=hooks)
        assert asked == [[first.id]] and steps == []  # declined before anything was pushed
        assert [r.id for r in await list_runs(pool["box"])] == [first.id]
        second = await launch(cfg, "tree", pool, hooks=hooks)
        assert asked == [[first.id]] * 2
        assert steps == ["pushing to box…", "starting tree…"] and len(second.pushes) == 1
        third = await launch(cfg, "tree", pool, force=True)  # the CLI's --force: nothing asked
        assert len(asked) == 2
        await stop_run(cfg, third.id, pool, grace=5)
        parent = int(first.records[0].pid or 0)
        child_pid = tmp_path / f"child-{parent}.pid"
        for _ in range(100):
            if child_pid.exists() and child_pid.read_text().strip():
                break
            await asyncio.sleep(0.05)
        child = int(child_pid.read_text())
        assert _alive(child) and _alive(parent)
        stopped = await stop_run(cfg, first.id, pool, grace=5)
        assert [r.status for r in stopped.records] == ["stopped"]
        assert stopped.records[0].exit_code == -signal.SIGTERM
        assert not _alive(child) and not _alive(parent)
        # stopping a finished run is harmless; the other run is untouched
        again = await stop_run(cfg, first.id, pool, grace=1)
        assert again.records[0].status == "stopped"
        recs = {r.id: r.status for r in await list_runs(pool["box"])}
        assert recs == {first.id: "stopped", second.id: "running", third.id: "stopped"}
        await stop_run(cfg, second.id, pool, grace=5)
    finally:
        await pool.close()


async def test_stop_escalates_to_sigkill_and_lost_runs(tmp_path: Path) -> None:
    stubborn = tmp_path / "stubborn.py"
    stubborn.write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                        "print('ready', flush=True)\ntime.sleep(300)\n")
    cfg = make_config(None, tmp_path, {
        "stubborn": Profile(name="stubborn", hosts=["box"], run=f"python {stubborn}"),
        "victim": Profile(name="victim", hosts=["box"], run="sleep 300")})
    pool = HostPool(cfg)
    try:
        run = await launch(cfg, "stubborn", pool)
        log = Path(run.records[0].run_dir) / "output.log"
        for _ in range(100):
            if log.exists() and "ready" in log.read_text():
                break
            await asyncio.sleep(0.05)
        t0 = time.monotonic()
        stopped = await stop_run(cfg, run.id, pool, grace=0.5)
        assert stopped.records[0].exit_code == -signal.SIGKILL
        assert stopped.records[0].status == "stopped"
        assert time.monotonic() - t0 < 10

        # a host reboot: command and monitor vanish without an exit record
        victim = await launch(cfg, "victim", pool)
        raw = victim.records[0].to_json()
        os.kill(raw["monitor_pid"], signal.SIGKILL)
        os.kill(raw["pid"], signal.SIGKILL)
        rec = await wait_status(pool["box"], victim.id, {"lost"}, timeout=10)
        assert rec.exit_code is None
        # a lost profile does not block a new launch
        again = await launch(cfg, "victim", pool)
        await stop_run(cfg, again.id, pool, grace=1)
    finally:
        await pool.close()


async def test_engine_run_writes_events(tmp_path: Path) -> None:
    cfg = make_config(None, tmp_path, {
        "mon": Profile(name="mon", hosts=["box"],
                       run=f"engine monitor --count 3 --interval 0.1 --path '{tmp_path}'")})
    pool = HostPool(cfg)
    try:
        run = await launch(cfg, "mon", pool)
        rec = await wait_status(pool["box"], run.id, {"succeeded", "failed"}, timeout=60)
    finally:
        await pool.close()
    assert rec.status == "succeeded", (Path(rec.run_dir) / "output.log").read_text()
    assert rec.argv[1:4] == ("-m", "engine", "monitor") and rec.argv[-1] == "--events"
    lines = (Path(rec.run_dir) / "events.jsonl").read_text().splitlines()
    kinds = [e.kind for e in map(events.parse, lines) if e is not None]
    assert kinds.count("sample") == 3 and len(kinds) == len(lines)   # stdout is events only


def test_launch_failure_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[hosts.box]\npython = "{sys.executable}"\nroot = "{tmp_path / "r"}"\n'
                   '[profiles.bad]\nhost = "box"\nrun = "no-such-program-xyz --flag"\n'
                   f'[profiles.nocwd]\nhost = "box"\nrun = "true"\ncwd = "{tmp_path / "nope"}"\n')
    assert cli_main(["--config", str(cfg), "launch", "bad"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: box: cannot run no-such-program-xyz") and err.count("\n") == 1
    assert cli_main(["--config", str(cfg), "launch", "nocwd"]) == 1
    assert "cannot enter working directory" in capsys.readouterr().err
    assert cli_main(["--config", str(cfg), "runs", "box", "--json"]) == 0
    recs = json.loads(capsys.readouterr().out)
    assert sorted(r["status"] for r in recs) == ["failed", "failed"]
    assert {r["exit_code"] for r in recs} == {127}
    assert cli_main(["--config", str(cfg), "runs", "box"]) == 0
    assert "bad-" in capsys.readouterr().out
    assert cli_main(["--config", str(cfg), "stop", "bad-nonexistent"]) == 1
    assert "no run 'bad-nonexistent'" in capsys.readouterr().err


def test_build_argv() -> None:
    box = HostConfig(name="box", python="/venv/bin/python")
    eng = Profile(name="p", hosts=["box"], run="engine train --data '/d d'", nproc_per_node=8)
    argv, is_engine = build_argv(eng, box, run_id="r1")
    assert is_engine
    assert argv == ["/venv/bin/python", "-m", "torch.distributed.run", "--nproc-per-node", "8",
                    "--standalone", "-m", "engine", "train", "--data", "/d d", "--events"]
    script = Profile(name="p", hosts=["a", "b"], run="python3 04_train.py --x 1")
    from console.scheduler.launch import Rendezvous
    argv, is_engine = build_argv(script, box, run_id="r1", node_rank=1,
                                 rdzv=Rendezvous("10.0.0.1", 29400))
    assert not is_engine
    assert argv[3:] == ["--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "1",
                        "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:29400",
                        "--rdzv-id", "r1", "04_train.py", "--x", "1"]
    out = Profile(name="p", hosts=["box"], run="engine train --out {run_dir}/out --tag {run_id} "
                  "--json '{\"a\": 1}'")
    argv, _ = build_argv(out, box, run_id="r7", run_dir="/root/runs/r7")
    assert argv[4:] == ["--out", "/root/runs/r7/out", "--tag", "r7", "--json", '{"a": 1}',
                        "--events"]
    plain = Profile(name="p", hosts=["box"], run="bash run.sh", nproc_per_node=2)
    assert build_argv(plain, box, run_id="r")[0][-3:] == ["--no-python", "bash", "run.sh"]
    assert build_argv(Profile(name="p", hosts=["box"], run="ls -l"), box, run_id="r") == \
        (["ls", "-l"], False)


def test_combined_status() -> None:
    assert combined_status([RunStatus("succeeded"), RunStatus("running")]) == "running"
    assert combined_status([RunStatus("succeeded"), RunStatus("failed")]) == "failed"
    assert combined_status([RunStatus("stopped"), RunStatus("failed")]) == "stopped"
    assert combined_status([RunStatus("succeeded"), RunStatus("succeeded")]) == "succeeded"
    assert combined_status([RunStatus("lost"), RunStatus("succeeded")]) == "lost"


def test_runs_columns_stay_in_line_with_a_long_profile_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.runs_registry import recorded_events, write_run

    long = "serve_converted_finetune_step_150_vllm_style"
    write_run(tmp_path, "finetune-20261205-120000-ab12", recorded_events()[:5],
              status="succeeded", start=1.0, end=2.0, exit_code=0, train_json=False)
    write_run(tmp_path, f"{long}-20261205-120500-cd34", recorded_events()[:5],
              status="failed", start=3.0, end=4.0, exit_code=1, train_json=False)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.local]\npython = "{sys.executable}"\nroot = "{tmp_path}"\n')
    assert cli_main(["--config", str(cfg), "runs", "local", "--wide"]) == 0
    head, *rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 2 and rows[0].split()[1] == long
    for col, words in (("STATUS", ("failed", "succeeded")), ("EXIT", ("1", "0"))):
        at = head.index(col)
        for row, word in zip(rows, words, strict=True):
            if col == "EXIT":     # right-aligned under its header
                assert row[at:at + 4].strip() == word, (head, row)
            else:
                assert row[at:].startswith(word), (head, row)


def test_runs_show_a_training_runs_best_held_out_figure(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """HELD-OUT: the best held-out acceptance length a training run
    exported so far at its step (`3.44@150`, as the Runs pane shows it), read by the host-side
    runner from OUT/best/provenance.json; `-` for a run with none, and for a record that is not
    a finite figure and a whole step."""
    from tests.runs_registry import recorded_events, write_run

    good = write_run(tmp_path, "finetune-20261205-120000-ab12", recorded_events()[:5],
                     status="succeeded", start=1.0, end=2.0, exit_code=0, best=(3.441, 150))
    write_run(tmp_path, "finetune-20261205-120500-cd34", recorded_events()[:5],
              status="failed", start=3.0, end=4.0, exit_code=1)
    bad = write_run(tmp_path, "finetune-20261205-121000-ef56", recorded_events()[:5],
                    status="succeeded", start=5.0, end=6.0, exit_code=0, best=(3.0, 10))
    (bad / "out" / "best" / "provenance.json").write_text(
        '{"held_out_tau": NaN, "step": 10}', encoding="utf-8")
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.local]\npython = "{sys.executable}"\nroot = "{tmp_path}"\n')
    assert cli_main(["--config", str(cfg), "runs", "local"]) == 0
    head, *rows = capsys.readouterr().out.splitlines()
    cells = {r.split()[0]: r for r in rows}
    at = head.index("HELD-OUT")
    assert cells[good.name][at:].split()[0] == "3.44@150", (head, cells[good.name])
    for rid in ("finetune-20261205-120500-cd34", bad.name):
        assert cells[rid][at:].split()[0] == "-", (head, cells[rid])
    assert cli_main(["--config", str(cfg), "runs", "local", "--json"]) == 0
    records = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert records[good.name]["best"] == {"tau": 3.441, "step": 150}
    assert "best" not in records[bad.name]


def test_runs_fits_100_columns_with_serve_run_ids(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A serve run's id is ~85 characters (its profile names the drafter): the table cuts ids
    in the middle (the time and suffix that tell runs apart stay) and long profile names at the
    end, so every line fits 100 columns; --json and --wide keep them whole."""
    from tests.runs_registry import recorded_events, write_run

    profile = "serve-finetune-20261205-120000-ab12-step_000150-converted-vllm"
    serve = f"{profile}-20261205-130000-ef56"
    assert len(serve) > 80
    write_run(tmp_path, "finetune-20261205-120000-ab12", recorded_events()[:5],
              status="succeeded", start=1.0, end=2.0, exit_code=0, train_json=False,
              best=(3.44, 150))
    write_run(tmp_path, serve, [], status="failed", start=3.0, end=4.0, exit_code=1,
              train_json=False)
    rec = json.loads((tmp_path / "runs" / serve / "run.json").read_text())
    (tmp_path / "runs" / serve / "run.json").write_text(json.dumps(dict(rec, profile=profile)))
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.local]\npython = "{sys.executable}"\nroot = "{tmp_path}"\n')
    assert cli_main(["--config", str(cfg), "runs", "local"]) == 0
    out, err = capsys.readouterr()
    head, *rows = out.splitlines()
    assert len(rows) == 2 and max(map(len, out.splitlines())) <= 100, out
    cut = rows[0].split()             # newest first: the serve run
    assert cut[0].endswith("…130000-ef56") and cut[0].startswith("serve-finetune-"), cut
    assert cut[1].startswith("serve-finetune") and cut[1].endswith("…"), cut
    assert rows[1].split()[0] == "finetune-20261205-120000-ab12"   # a training id stays whole
    assert rows[1][head.index("HELD-OUT"):].split()[0] == "3.44@150"
    assert "--wide" in err and err.count("\n") == 1, err
    assert cli_main(["--config", str(cfg), "runs", "local", "--json"]) == 0
    assert {r["id"] for r in json.loads(capsys.readouterr().out)} == {
        serve, "finetune-20261205-120000-ab12"}
    assert cli_main(["--config", str(cfg), "runs", "local", "--wide"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[1].split()[:2] == [serve, profile] and err == ""
    assert len(out.splitlines()[1]) > 100


def test_runs_elapsed_counts_every_attempt_of_a_resumed_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run stopped after 100 s and resumed for 200 s ran 5 minutes, not the last 200 s."""
    from tests.runs_registry import recorded_events, write_run

    run = "finetune-20261205-120000-ab12"
    write_run(tmp_path, run, recorded_events()[:5], status="succeeded", start=1000.0,
              end=1200.0, exit_code=0, train_json=False)
    path = tmp_path / "runs" / run / "run.json"
    path.write_text(json.dumps({**json.loads(path.read_text()),
                                "attempts": [{"start": 100.0, "end": 200.0}]}))
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.local]\npython = "{sys.executable}"\nroot = "{tmp_path}"\n')
    assert cli_main(["--config", str(cfg), "runs", "local"]) == 0
    head, row = capsys.readouterr().out.splitlines()
    assert row[head.index("ELAPSED"):].split()[0] == "0:05:00", row
