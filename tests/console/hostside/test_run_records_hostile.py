"""One run's files never take a host's run list down: a record or a best/provenance.json nested
past the stack, a FIFO, a link to /dev/zero or a figure out of range makes that run `corrupt`
(or its HELD-OUT `-`), and every other run still lists, stops and launches.

The real host-side runner script on real files; the CLI through the local host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from console.hostside import records
from console.hostside import runner as runner_module
from console.scheduler.run_record import RunRecord
from tests.console_cli import cli
from tests.detached_runs import local_toml
from tests.interrupts import interrupt_everywhere
from tests.runs_registry import write_run

RUNNER = Path(runner_module.__file__)
GOOD = "finetune-20261201-100000-aaaa"
BAD = "finetune-20261201-110000-bbbb"
DEEP = "[" * 100000 + "]" * 100000


def runner_list(runs: Path, *run_id: str) -> list[dict[str, object]]:
    """`runner.py list` as the console runs it on a host (a script, -B), bounded in time: a read
    that blocks fails the test instead of hanging it."""
    res = subprocess.run([sys.executable, "-B", str(RUNNER), "list", str(runs), *run_id],
                         capture_output=True, text=True, timeout=20)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert isinstance(out, list)
    return out


def two_runs(root: Path) -> tuple[Path, Path]:
    now = time.time()
    good = write_run(root, GOOD, [], status="succeeded", start=now - 100, end=now - 50,
                     exit_code=0, train_json=False, best=(3.44, 150))
    bad = write_run(root, BAD, [], status="succeeded", start=now - 40, end=now - 10,
                    exit_code=0, train_json=False, best=(3.5, 100))
    return good, bad


def by_id(recs: list[dict[str, object]]) -> dict[object, dict[str, object]]:
    return {r["id"]: r for r in recs}


@pytest.mark.parametrize("kind", ["deep", "fifo", "dev-zero", "huge"])
def test_a_bad_provenance_hides_only_its_own_figure(tmp_path: Path, kind: str) -> None:
    good, bad = two_runs(tmp_path)
    prov = bad / "out" / "best" / "provenance.json"
    prov.unlink()
    if kind == "deep":
        prov.write_text(DEEP)
    elif kind == "fifo":
        os.mkfifo(prov)
    elif kind == "dev-zero":
        prov.symlink_to("/dev/zero")
    else:
        prov.write_text('{"held_out_tau": 3.0, "step": 1, "pad": "' + "x" * (2 << 20) + '"}')
    t0 = time.monotonic()
    recs = by_id(runner_list(tmp_path / "runs"))
    assert time.monotonic() - t0 < 10
    assert recs[GOOD]["best"] == {"tau": 3.44, "step": 150}
    assert recs[BAD]["status"] == "succeeded" and "best" not in recs[BAD]
    assert runner_list(tmp_path / "runs", BAD)[0]["status"] == "succeeded"   # find's lookup


@pytest.mark.parametrize("kind", ["deep", "deep-valid", "fifo", "dev-zero"])
def test_a_bad_record_is_corrupt_and_the_others_list(tmp_path: Path, kind: str) -> None:
    good, bad = two_runs(tmp_path)
    rec = bad / "run.json"
    rec.unlink()
    if kind == "deep":
        rec.write_text(DEEP)
    elif kind == "deep-valid":   # parses, but nests far deeper than a record of ours
        rec.write_text(json.dumps({"id": BAD, "profile": "finetune", "status": "succeeded",
                                   "argv": json.loads("[" * 500 + "]" * 500)}))
    elif kind == "fifo":
        os.mkfifo(rec)
    else:
        rec.symlink_to("/dev/zero")
    t0 = time.monotonic()
    recs = by_id(runner_list(tmp_path / "runs"))
    assert time.monotonic() - t0 < 10
    assert recs[GOOD]["status"] == "succeeded"
    assert recs[BAD]["status"] == "corrupt"
    why = str(recs[BAD]["error"])
    assert "run.json" in why and len(why) < 300, why
    assert runner_list(tmp_path / "runs", BAD)[0]["status"] == "corrupt"


def test_the_cli_lists_stops_and_launches_beside_a_bad_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`runs`, `launch --unless-running` and `stop` of another run work while one run holds a
    provenance nested past the stack and another a run.json nested the same way."""
    cfg = local_toml(tmp_path, '[profiles.sleeper]\nhost = "box"\nrun = "sleep 60"\n')
    root = tmp_path / "host root"
    good, bad = two_runs(root)
    (bad / "out" / "best" / "provenance.json").write_text(DEEP)
    nested = root / "runs" / "finetune-20261201-120000-cccc"
    nested.mkdir()
    (nested / "run.json").write_text(DEEP)
    code, out, err = cli(capsys, cfg, "launch", "sleeper")   # checks for a running copy first
    assert code == 0, err
    started = out.splitlines()[0]
    code, out, err = cli(capsys, cfg, "runs", "box", "--json")
    assert code == 0, err
    recs = by_id(json.loads(out))
    assert recs[GOOD]["best"] == {"tau": 3.44, "step": 150}
    assert recs[BAD]["status"] == "succeeded"
    assert recs[nested.name]["status"] == "corrupt"
    assert recs[started]["status"] in ("running", "succeeded")
    code, out, err = cli(capsys, cfg, "stop", started, "--grace", "2")
    assert code == 0 and "stopped" in out, (out, err)


@pytest.mark.parametrize("tau,step", [(1e308, 150), (-1e300, -5), (3.4, 10 ** 35),
                                      (0.5, 10), (3.4, -1), (float("nan"), 3), (True, 3)])
def test_held_out_out_of_range_is_not_shown(tmp_path: Path, tau: object, step: int) -> None:
    good, bad = two_runs(tmp_path)
    (bad / "out" / "best" / "provenance.json").write_text(json.dumps(
        {"held_out_tau": tau, "step": step}))
    recs = by_id(runner_list(tmp_path / "runs"))
    assert "best" not in recs[BAD]
    # the console checks again what a host sends
    listed = dict(recs[GOOD], best={"tau": tau, "step": step})
    assert RunRecord.from_dict(listed, "box").best_cell() == "-"
    assert RunRecord.from_dict(recs[GOOD], "box").best_cell() == "3.44@150"


def test_held_out_edge_values_are_shown(tmp_path: Path) -> None:
    good, bad = two_runs(tmp_path)
    (bad / "out" / "best" / "provenance.json").write_text(json.dumps(
        {"held_out_tau": 1, "step": 0}))
    recs = by_id(runner_list(tmp_path / "runs"))
    assert RunRecord.from_dict(recs[BAD], "box").best_cell() == "1.00@0"


def test_ctrl_c_anywhere_in_reading_a_record_is_the_interrupt_never_ebadf(tmp_path: Path) -> None:
    """The runner reads records under signals: the descriptor is closed once, by whoever owns it
    when the interrupt lands (closing it twice could close another thread's file)."""
    f = tmp_path / "record.json"
    f.write_text("{}")
    points = interrupt_everywhere(lambda: records.read_bounded(str(f)),
                                  [records.read_bounded, os.fdopen])
    assert points > 10
