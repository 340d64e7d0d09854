"""`train --eval-server` against a broken or hostile server (tests/vllm_swap_standin.py on
127.0.0.1), in real `python -m engine train` runs on the demo data: every fault of the server
during a measurement (a NaN counter, `"completion_tokens": "eight"`, a JSON list, a 100 MiB
answer, a bad status line, a stall past the measurement's deadline) is a warning and the run
ends `done` with the drafter swapped back; a swap back that fails is one worded error and
run.json ends `failed`; a folder given for the server's own drafter that is another drafter is
refused before anything is swapped."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine import events
from engine.errors import EngineError
from engine.training.served_eval import ServedEval
from tests.drafters import write_drafter
from tests.engine_helpers import REPO, engine_env, train_args
from tests.vllm_swap_standin import SwapServer

pytest_plugins = ("tests.demo_workspace",)
pytestmark = pytest.mark.slow   # real training runs

#: the fault each checkpoint's measurement meets (once, on the route named), in order
FAULTS = [("nan", "/metrics"), ("words", "/v1/completions"), ("list", "/v1/completions"),
          ("huge", "/v1/completions"), ("badline", "/v1/completions"),
          ("stall", "/v1/completions")]
DEADLINE_S = 4


def train(demo: Path, out: Path, url: str, *extra: str, timeout: float = 600
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine",
                           *train_args(demo, out, "--holdout", "4", "--eval-server", url,
                                       "--eval-server-tokens", "4", *extra)],
                          cwd=REPO, env=engine_env(), capture_output=True, text=True,
                          timeout=timeout)


def logs(out: Path) -> list[events.Log]:
    got = [events.parse(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return [e for e in got if isinstance(e, events.Log)]


def served(out: Path) -> list[events.Metric]:
    got = [events.parse(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return [e for e in got if isinstance(e, events.Metric) and e.name == events.SERVED]


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """The drafter the server started with (a folder of weights: the stand-in reads nothing)."""
    write_drafter(tmp_path / "base", seed=1)
    return tmp_path / "base"


def test_every_fault_of_the_server_is_a_warning(demo_dir: Path, base: Path,
                                                tmp_path: Path) -> None:
    hit: set[int] = set()

    def fault(method: str, path: str) -> str | None:
        swaps = [p for p in srv.swaps_in() if p != str(base)]
        n = len(swaps)            # the checkpoint being measured (1-based), 0 before the first
        if not 1 <= n <= len(FAULTS) or srv.swaps_in()[-1] == str(base) or n in hit:
            return None
        kind, route = FAULTS[n - 1]
        if path.startswith(route):
            hit.add(n)
            return kind
        return None

    srv = SwapServer(base, fault=fault)
    out = tmp_path / "run"
    try:
        p = train(demo_dir, out, srv.url, "--max-steps", str(len(FAULTS) + 1), "--save-every",
                  "1", "--eval-server-deadline", str(DEADLINE_S))
    finally:
        srv.close()
    assert p.returncode == 0, p.stderr[-3000:]
    warned = [e.msg for e in logs(out) if "served acceptance not measured" in e.msg]
    assert len(warned) == len(FAULTS), warned
    for msg, want in zip(warned, ["vllm:spec_decode_num_drafts is NaN", "'eight'",
                                  "not a JSON object", "AnswerTooLarge", "BadStatusLine",
                                  f"the measurement's deadline ({DEADLINE_S} s, "
                                  "--eval-server-deadline)"], strict=True):
        assert want in msg, (want, msg)
    assert [e.step for e in served(out)] == [len(FAULTS) + 1]   # the last one, unharmed
    assert json.loads((out / "run.json").read_text())["status"] == "done"
    assert (srv.version, srv.serving) == ("default", str(base))   # swapped back once, at the end
    assert srv.swaps_in().count(str(base)) == 1


def test_a_swap_back_that_fails_is_worded_and_run_json_ends(demo_dir: Path, base: Path,
                                                            tmp_path: Path) -> None:
    # a server that breaks once the original drafter is loaded again: a bad status line
    srv = SwapServer(base, fault=lambda m, p: "badline" if srv.updates
                     and srv.updates[-1] == str(base) else None)
    out = tmp_path / "run"
    try:
        p = train(demo_dir, out, srv.url, "--max-steps", "2", "--save-every", "2")
    finally:
        srv.close()
    assert p.returncode == 1
    assert "Traceback" not in p.stderr
    err = p.stderr.strip().splitlines()[-1]
    assert "could not swap" in err and "BadStatusLine" in err and str(base) in err, err
    assert "may still serve step_000002@" in err
    rec = json.loads((out / "run.json").read_text())
    assert rec["status"] == "failed"
    assert srv.swaps_in().count(str(base)) == 1          # tried once, not once per handler


def test_another_drafters_folder_is_not_swapped_in_as_default(demo_dir: Path, base: Path,
                                                              tmp_path: Path) -> None:
    write_drafter(tmp_path / "other", seed=2)
    srv = SwapServer(base)
    out = tmp_path / "run"
    try:
        p = train(demo_dir, out, srv.url, "--max-steps", "2", "--save-every", "2",
                  "--eval-server-drafter", str(tmp_path / "other"))
        # a copy of the server's own drafter is that drafter: accepted
        shutil.copytree(base, tmp_path / "copy")
        ev = ServedEval(srv.url, [[1, 2]], 4, restore_folder=str(tmp_path / "copy"))
        assert "weight version default" in ev.open()
        with pytest.raises(EngineError, match="neither its path nor its weights"):
            ServedEval(srv.url, [[1, 2]], 4, restore_folder=str(tmp_path / "other")).open()
    finally:
        srv.close()
    assert p.returncode == 1
    err = p.stderr.strip().splitlines()[-1]
    assert f"--eval-server-drafter {tmp_path / 'other'}" in err and str(base) in err, err
    assert srv.swaps_in() == [] and srv.bodies("POST", "/start_draft_weight_update") == []
    assert (srv.version, srv.serving) == ("default", str(base))
