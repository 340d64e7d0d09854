"""`stop` of a training run that measures its checkpoints in a serving vLLM (`eval_server` in
its profile): a real host-side runner starts `python -m engine train` on the demo data against
a stand-in server (tests/vllm_swap_standin.py on 127.0.0.1). A swap back slower than the grace
is waited for (the server ends on its own drafter, the stop says what it waited for); a swap
back the server refuses is a warning naming what the server serves and what it should serve,
and `launch --resume` then swaps the run's own checkpoint out without being told."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from console.cli import main as cli_main
from engine import events
from engine.demo.workspace import TRAIN_ARGS
from tests.drafters import write_drafter
from tests.vllm_swap_standin import SwapServer
from tests.waiting import wait_until

pytest_plugins = ("tests.demo_workspace",)
pytestmark = pytest.mark.slow   # real training runs

SWAP_BACK_S = 6.0


def write_config(tmp: Path, demo: Path, url: str) -> Path:
    info = json.loads((demo / "demo.json").read_text())
    run = " ".join(["engine train", "--target", str(demo / "target"), "--data",
                    str(demo / "data"), "--out", "{run_dir}/out", "--draft-vocab-size",
                    str(info["draft_vocab_size"]), *TRAIN_ARGS, "--max-steps", "400",
                    "--save-every", "2", "--holdout", "4", "--eval-server-tokens", "4"])
    cfg = tmp / "config.toml"
    cfg.write_text(f'[hosts.box]\npython = "{sys.executable}"\nroot = "{tmp / "root"}"\n'
                   f'[profiles.tune]\nhost = "box"\nrun = "{run}"\neval_server = "{url}"\n')
    return cfg


def launched(cfg: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert cli_main(["--config", str(cfg), "launch", "tune"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert cli_main(["--config", str(cfg), "runs", "box", "--json"]) == 0
    recs = json.loads(capsys.readouterr().out)
    return str(recs[-1]["id"])


def log_lines(out: Path) -> list[str]:
    if not (out / "events.jsonl").is_file():
        return []
    got = [events.parse(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return [e.msg for e in got if isinstance(e, events.Log)]


def measured(out: Path) -> int:
    return sum(" served by " in m for m in log_lines(out))


@pytest.fixture
def base(tmp_path: Path) -> Path:
    write_drafter(tmp_path / "base", seed=1)
    return tmp_path / "base"


def test_stop_waits_for_the_drafter_swapped_back(demo_dir: Path, base: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    srv = SwapServer(base)
    try:
        cfg = write_config(tmp_path, demo_dir, srv.url)
        run_id = launched(cfg, capsys)
        out = tmp_path / "root" / "runs" / run_id / "out"
        wait_until(lambda: measured(out), timeout=300, what="the first served measurement")
        assert srv.version.startswith("step_0000")
        srv.swap_s = SWAP_BACK_S         # a large drafter: the swap back outlasts the grace
        t0 = time.monotonic()
        code = cli_main(["--config", str(cfg), "stop", run_id, "--grace", "1"])
        took = time.monotonic() - t0
        said = capsys.readouterr()
    finally:
        srv.close()
    assert code == 0, said.err
    assert (srv.version, srv.serving) == ("default", str(base))
    assert took >= SWAP_BACK_S
    assert f"{run_id} on box: stopped" in said.out
    assert "after swapping the eval server's drafter back" in said.out and str(base) in said.out
    assert any("swapped its drafter back (default)" in m for m in log_lines(out))


def test_a_refused_swap_back_is_named_and_resume_recovers(
        demo_dir: Path, base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refusing = [False]
    srv = SwapServer(base, fault=lambda m, p: "refuse" if refusing[0]
                     and p == "/update_weights" else None)
    try:
        cfg = write_config(tmp_path, demo_dir, srv.url)
        run_id = launched(cfg, capsys)
        out = tmp_path / "root" / "runs" / run_id / "out"
        wait_until(lambda: measured(out), timeout=300, what="the first served measurement")
        refusing[0] = True                # the server refuses every load from now on
        assert cli_main(["--config", str(cfg), "stop", run_id, "--grace", "5"]) == 1
        said = capsys.readouterr()
        serves = srv.version
        assert serves.startswith("step_0000") and srv.serving != str(base)
        warning = said.err.strip().splitlines()[-1]
        assert warning.startswith(f"warning: {run_id} on box: the eval server {srv.url} may "
                                  f"still serve {serves}"), warning
        assert f"it should serve {base} (weight version default)" in warning

        # the server takes loads again; the run resumed knows the checkpoint as its own
        refusing[0] = False
        before = measured(out)
        assert cli_main(["--config", str(cfg), "launch", "--resume", run_id]) == 0, \
            capsys.readouterr().err
        wait_until(lambda: any(f"with {serves}, a checkpoint of this run" in m
                               for m in log_lines(out)), timeout=300, what="the resumed run")
        wait_until(lambda: measured(out) > before, timeout=300, what="a new measurement")
        assert cli_main(["--config", str(cfg), "stop", run_id, "--grace", "5"]) == 0
        capsys.readouterr()
    finally:
        srv.close()
    assert (srv.version, srv.serving) == ("default", str(base))
