"""Compare served drafters: two real serving sessions (`serve` on the local host starting a
stand-in `vllm`) measured through stand-in /metrics servers, the table in the console and the
`compare` subcommand, saved `metrics --json` output re-shown, and a snapshot."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from console.checkpoints.compare import read_scrapes, table
from console.checkpoints.serve import ServeRequest, serve
from console.cli import main as cli_main
from console.dialogs.compare import CompareScreen
from console.hosts.host import HostPool
from console.runs.service import list_runs, stop_run
from tests.drafters import write_drafter
from tests.paths import REPO
from tests.runs_registry import fresh_snap_root, local_app, local_config
from tests.serving import drop_fields, write_verifier
from tests.serving_journal import (
    parsed_rows,
    record_scrape,
    record_session,
    scrape,
    two_served_drafters,
)
from tests.sshd import free_port
from tests.vllm_metrics_standin import State, VllmMetricsStandin

pytest_plugins = ("tests.serving",)
SIZE = (140, 36)


pytestmark = pytest.mark.usefixtures("utc")


def test_rows_take_each_sessions_newest_series_and_match_saved_scrapes_by_time() -> None:
    url = "http://127.0.0.1:8000/metrics"
    sessions = [
        {"run_id": "a", "host": "box", "drafter": "/d/public", "k": 3, "metrics": url,
         "started": 100.0, "provenance": {}},
        {"run_id": "b", "host": "box", "drafter": "/r/ft/out/final", "k": 3, "metrics": url,
         "started": 200.0, "provenance": {"run": "/r/ft", "step": 150,
                                           "finetune": {"path": "/d/public"}}},
    ]
    scrapes = [
        scrape(110, 1, 10, 12, [0.6, 0.4, 0.2]),            # no run id: a's by host, URL, time
        scrape(150, 1, 100, 120, [0.6, 0.4, 0.2], seconds=40.0, tps=55.0),
        {**scrape(210, 1, 50, 90, [0.9, 0.6, 0.3]), "run_id": "b"},
        {**scrape(220, 1, 80, 150, [0.9, 0.6, 0.3]), "run_id": "b"},
        {**scrape(230, 2, 20, 40, [0.9, 0.7, 0.4]), "run_id": "b"},  # b's server restarted
        scrape(90, 1, 1, 1, [1.0]),                          # before any session: nobody's
    ]
    table_rows = parsed_rows(sessions, scrapes)
    got = {r.run_id: r for r in table_rows}
    assert [r.run_id for r in table_rows] == ["b", "a"]  # newest first
    assert got["a"].acceptance_length == pytest.approx(2.2) and got["a"].seconds == 40.0
    assert got["a"].generation_tokens_per_s == 55.0
    assert got["b"].acceptance_length == pytest.approx(3.0)  # the newest series, not 2.875
    assert got["b"].per_position == (0.9, 0.7, 0.4)
    assert got["b"].provenance == "ft@150 < public"


# `vllm` on PATH: records argv, then waits to be stopped (the test's servers hold the ports)
@pytest.mark.usefixtures("standin_vllm")
async def test_two_serving_sessions_measured_in_the_console_and_by_the_subcommand(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    verifier = write_verifier(tmp_path / "target")
    public, tuned = tmp_path / "shelf" / "public", tmp_path / "runs" / "ft" / "out" / "final"
    write_drafter(public, seed=1)
    write_drafter(tuned, seed=2)
    # the stand-in vllm stays silent: the test serves the figures on the servers' ports
    drop_fields(tmp_path / "bin" / "vllm", "mute")
    ports = [free_port(), free_port()]
    servers: list[VllmMetricsStandin] = []
    cfg = local_config(tmp_path / "host")
    app = local_app(cfg)
    host = next(iter(cfg.hosts))
    try:
        async with app.run_test(size=SIZE) as pilot:
            for ckpt, port in zip((public, tuned), ports, strict=True):
                await serve(cfg, host, ServeRequest(str(ckpt), str(verifier), port=port),
                            app.pool)
            servers += [
                VllmMetricsStandin(State(drafts=100, draft_tokens=300, accepted=150,
                                         per_position=(80, 50, 20), generation_tokens=1000),
                                   port=ports[0]),
                VllmMetricsStandin(State(drafts=100, draft_tokens=300, accepted=240,
                                         per_position=(95, 85, 60), generation_tokens=1000),
                                   port=ports[1])]
            await pilot.press("6")
            await pilot.press("m")
            screen = app.screen
            assert isinstance(screen, CompareScreen)
            await _until(pilot, lambda: screen.measured >= 1)
            # the servers go on serving: counters move between scrapes
            servers[0].set(drafts=200, accepted=300, generation_tokens=3000)
            servers[1].set(drafts=200, accepted=480, generation_tokens=3000)
            screen.action_refresh()
            await _until(pilot, lambda: screen.measured >= 2)
            by = {r.drafter: r for r in screen.rows}
            assert by[str(public)].acceptance_length == pytest.approx(2.5)
            assert by[str(tuned)].acceptance_length == pytest.approx(3.4)
            assert by[str(tuned)].per_position == pytest.approx((0.475, 0.425, 0.3))
            assert by[str(tuned)].generation_tokens_per_s is not None
    finally:
        for srv in servers:
            srv.stop()
        pool = HostPool(cfg)
        try:
            for rec in await list_runs(pool[host]):
                if rec.status == "running":
                    await stop_run(cfg, rec.id, pool, grace=2.0)
        finally:
            await pool.close()
    # the measurements were kept: the subcommand re-shows them after the servers are gone
    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text('[hosts.box]\nroot = "/tmp/unused"\n')
    assert await asyncio.to_thread(cli_main, ["--config", str(cfg_path), "compare", "--json"]) == 0
    shown = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert [round(r["acceptance_length"], 3) for r in shown] == [3.4, 2.5]


@pytest.mark.slow
@pytest.mark.usefixtures("standin_vllm")
async def test_provenance_names_the_run_and_step_of_exported_and_converted_drafters(
        tmp_path: Path) -> None:
    """RUN@STEP < SOURCE, from what `engine inspect` reports: a training export's run is its
    run directory's name (not `out`); a converted drafter's comes from the training record
    the conversion carried over (`origin`), never from its `source` dict."""
    from engine.ckpt.drafter_save import save_drafter
    from tests.drafters import random_state, tiny_config

    verifier = write_verifier(tmp_path / "target")
    public = tmp_path / "shelf" / "public-eagle3"
    write_drafter(public, seed=1)
    cfg = local_config(tmp_path / "host")
    host = next(iter(cfg.hosts))
    out = tmp_path / "host" / "runs" / "finetune-20261205-080000-ab12" / "out"
    save_drafter(out / "final", tiny_config(), random_state(tiny_config(), 2),
                 include_embed=False, provenance={  # what the trainer's export records
                     "run": str(out), "step": 150, "held_out_tau": 3.1,
                     "finetune": {"path": str(public), "format": "eagle",
                                  "sha256": {"model.safetensors": "ab" * 32}}})
    converted = tmp_path / "host" / "converted" / "finetune-step_150-vllm"
    r = subprocess.run([sys.executable, "-m", "engine", "convert", str(out / "final"),
                        str(converted), "--to", "vllm", "--verifier", str(verifier)],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert isinstance(json.loads((converted / "provenance.json").read_text())["source"], dict)
    pool = HostPool(cfg)
    try:
        for port, ckpt in enumerate((public, out / "final", converted), start=18401):
            await serve(cfg, host, ServeRequest(str(ckpt), str(verifier), port=port), pool)
        for rec in await list_runs(pool[host]):
            if rec.status == "running":
                await stop_run(cfg, rec.id, pool, grace=2.0)
    finally:
        await pool.close()
    by = {r.drafter: r.provenance for r in table()}
    assert by[str(out / "final")] == "finetune-20261205-080000-ab12@150 < public-eagle3"
    assert by[str(converted)] == "finetune-20261205-080000-ab12@150 < public-eagle3"
    assert by[str(public)] == ""      # a downloaded drafter: its name says it all


async def _until(pilot: Pilot[Any], cond: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the app")
        await pilot.pause(0.05)


def test_saved_metrics_json_is_reshown(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    """`metrics --json > FILE` output, shown with `compare --from FILE`."""
    url = "http://127.0.0.1:8000/metrics"
    record_session({"run_id": "serve-x-1", "host": "box", "drafter": "/d/x", "k": 4,
                    "metrics": url, "started": 1000.0})
    saved = tmp_path / "scrapes.jsonl"
    saved.write_text(json.dumps(scrape(1010.0, 1, 40, 100, [0.9, 0.8, 0.5, 0.3], url=url))
                     + "\nnot json\n")
    assert len(read_scrapes([saved])) == 1
    assert table()[0].acceptance_length is None  # nothing recorded by the console itself
    cfg = tmp_path / "config.toml"
    cfg.write_text('[hosts.box]\nroot = "/tmp/x"\n')
    assert cli_main(["--config", str(cfg), "compare", "--from", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "/d/x" in out and "3.50" in out and "0.90 0.80 0.50 0.30" in out


def test_snapshot_compare_table(snap_compare: Any) -> None:
    root = fresh_snap_root("compare")
    url = "http://127.0.0.1:8000/metrics"
    t0 = 1_764_504_000.0
    two_served_drafters(url, t0)
    app = local_app(local_config(root / "host"))

    async def run_before(pilot: Pilot[Any]) -> None:
        pilot.app.push_screen(CompareScreen(measure=False))
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


async def test_the_table_keeps_the_acceptance_length_on_80x24(tmp_path: Path) -> None:
    """At 80 columns the drafter's name pushed Acc len off the screen."""
    url = "http://127.0.0.1:8000/metrics"
    drafter = "/srv/eagle3/runs/finetune-20261130-140141-0f0f/out/final"
    record_session({"run_id": "serve-ft-final-1", "host": "local", "k": 3, "metrics": url,
                    "drafter": drafter, "started": 1_764_504_000.0,
                    "provenance": {"run": "/srv/eagle3/runs/finetune-20261130-140141-0f0f",
                                   "step": 150, "finetune": {"path": "/models/public-eagle3"}}})
    record_scrape("serve-ft-final-1", scrape(1_764_505_000.0, 1, 2000, 3880, [0.87, 0.63, 0.44],
                                             url=url, seconds=600.0, tps=1093.0))
    app = local_app(local_config(tmp_path / "host"))
    async with app.run_test(size=(80, 24)) as pilot:
        app.push_screen(CompareScreen(measure=False))
        await pilot.pause()
        t = app.screen.query_one("DataTable")
        assert t.virtual_size.width <= t.size.width   # nothing beyond the right edge
        labels = [str(c.label) for c in t.columns.values()]
        assert labels[:4] == ["Drafter", "Provenance", "k", "Acc len"]
        row = [c.plain for c in t.get_row_at(0)]   # cells are Text: a host's path is not markup
        assert row[3] == "2.94" and row[0] == "…" + drafter[-16:]
        await pilot.resize_terminal(140, 36)   # wide again: every column back
        await pilot.pause()
        assert [str(c.label) for c in t.columns.values()][-2:] == ["Watched", "Version"]
        assert t.get_row_at(0)[0].plain == "…" + drafter[-27:]
        assert t.virtual_size.width <= t.size.width
