"""The comparison over what this workstation's journal holds, whatever it holds: damaged, cut,
duplicate and oddly typed lines open in the console and the subcommand as rows or not at all,
never as a crash; a server whose drafter was swapped is measured per weight version (a stand-in
swappable vLLM on 127.0.0.1, tests/vllm_swap_standin.py), never under one name; `r` with
nothing to measure says so; the provenance column is whole in the subcommand."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Static

from console.checkpoints.compare import Measurer, table
from console.checkpoints.journal import (
    BenchRun,
    Figures,
    Provenance,
    Scrape,
    Session,
    SpecCounts,
    SwapRecord,
    load,
    record,
    results_path,
    sessions_path,
    swaps_path,
)
from console.cli import main as cli_main
from console.dialogs.compare import CompareScreen
from console.hosts.host import HostPool
from tests.console_cli import console
from tests.panes import open_compare
from tests.runs_registry import local_app, local_config
from tests.serving_journal import record_scrape, record_session, record_swap
from tests.vllm_swap_standin import SwapServer
from tests.waiting import wait_for

URL = "http://127.0.0.1:8000/metrics"
T0 = 1_764_504_000.0
pytestmark = pytest.mark.usefixtures("utc")


def total(drafts: int, accepted: int) -> dict[str, Any]:
    return {"drafts": drafts, "accepted": accepted, "draft_tokens": 3 * drafts,
            "acceptance_length": 1 + accepted / drafts, "per_position": [0.9, 0.5, 0.2],
            "generation_tokens_per_s": 80.0, "seconds": 30.0}


def write_journal(with_damage: bool) -> None:
    """serve -> bench -> swap -> bench on one server, as the writers record it, and (with_damage)
    every kind of line a damaged, hand-edited or older journal holds."""
    session = {"run_id": "serve-pub-1", "host": "local", "drafter": "/m/public", "k": 3,
               "port": 8000, "metrics": URL, "started": T0, "swappable": True,
               "provenance": {}, "verifier": "/m/target"}
    record_session(session)
    record_scrape("serve-pub-1", {"host": "local", "url": URL, "bench": True, "t": T0 + 60,
                                  "drafter": "/m/public", "weight_version": "default",
                                  "total": total(100, 120)})
    record_swap({"run_id": "serve-pub-1", "host": "local", "url": "http://127.0.0.1:8000",
                 "drafter": "/r/ft/out/checkpoints/step_000030", "weight_version": "s30@ab",
                 "previous": "/m/public", "previous_version": "default", "seconds": 0.5,
                 "t": T0 + 90})
    record_scrape("serve-pub-1", {"host": "local", "url": URL, "bench": True, "t": T0 + 120,
                                  "drafter": "/r/ft/out/checkpoints/step_000030",
                                  "weight_version": "s30@ab", "total": total(100, 200)})
    if not with_damage:
        return
    bad = [
        "{", "[]", "null", '"text"', "{}", '{"run_id": 5, "host": "local"}',
        json.dumps({**session, "started": "soon", "k": "three", "port": 1e400}),
        json.dumps({**session, "run_id": "serve-odd-2", "started": float("nan"),
                    "k": -4, "port": 70000, "metrics": ["x"], "provenance": "ft@1",
                    "swappable": "yes", "drafter": {"a": 1}}),
        json.dumps(session),   # the same session twice
        '{"run_id": "serve-deep-3", "host": "local", "provenance": ' + "[" * 5000 + "]" * 5000
        + "}",
    ]
    with open(str(sessions_path()), "a", encoding="utf-8") as f:
        f.write("\n".join(bad) + "\n")
    with open(str(sessions_path()), "ab") as fb:
        fb.write(b'{"run_id": "serve-bytes-4", "host": "local", "drafter": "/m/\xff\xfe"}\n')
    scrapes = [
        {"run_id": "serve-pub-1", "t": "later"}, {"run_id": "serve-pub-1", "t": float("inf")},
        {"run_id": "serve-pub-1", "t": T0 + 200, "series": "two", "total": [1, 2]},
        {"run_id": "serve-pub-1", "t": T0 + 210, "bench": True, "weight_version": 7,
         "total": {"drafts": "many", "acceptance_length": 1e308,
                   "per_position": ["a", None], "seconds": -1}},
        {"run_id": "serve-odd-2", "t": T0 + 220, "interval": {"drafts": 1e400},
         "weight_version": "x@1", "steady": True},
        {"run_id": "serve-nobody", "t": T0 + 230, "total": total(10, 10)},
        {"t": T0 + 240, "host": "local", "url": URL, "error": {"why": "a dict"}},
    ]
    with open(str(results_path()), "a", encoding="utf-8") as f:
        f.write("\n".join(json.dumps(s) for s in scrapes) + "\n{\"cut\n")
    with open(str(swaps_path()), "a", encoding="utf-8") as f:
        f.write('{"host": "local"}\n{"drafter": 1, "host": "local", "weight_version": "z"}\n'
                + json.dumps({"host": "local", "drafter": "/d", "weight_version": "s99@ff",
                              "provenance": {"run": 5, "step": "x", "finetune": "f"}})
                + "\n\xff\n")


@pytest.mark.parametrize("damage", [False, True])
async def test_the_table_opens_over_a_swapped_servers_rows_and_a_damaged_journal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: bool) -> None:
    """Two replays of one server (before and after a swap) are two rows of one run id: the
    table keyed its rows by run id and `m` ended the console, on every later start too."""
    write_journal(damage)
    app = local_app(local_config(tmp_path / "host"))
    async with app.run_test(size=(140, 36)) as pilot:
        screen = await open_compare(pilot)
        bench = [r for r in screen.rows if r.run_id == "serve-pub-1" and r.acceptance_length]
        assert sorted((r.weight_version, r.acceptance_length, r.provenance) for r in bench) == [
            ("default", 2.2, ""), ("s30@ab", 3.0, "ft@30")]
        assert screen.query_one("DataTable").row_count == len(screen.rows)
        status = str(screen.query_one("#compare-status", Static).render())
        assert ("serving.jsonl: 7 damaged lines skipped" in status) is damage, status
        await pilot.press("down", "down", "down")
        await pilot.pause()
        assert app.is_running
    assert await asyncio.to_thread(cli_main, ["compare"]) == 0
    out = capsys.readouterr().out
    assert "s30@ab" in out and "ft@30" in out, out
    assert await asyncio.to_thread(cli_main, ["compare", "--json"]) == 0
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["run_id"] for r in shown} >= {"serve-pub-1"}


async def test_a_measured_server_is_counted_per_weight_version(tmp_path: Path) -> None:
    """Scrapes of a server that serves the public drafter, then (swapped) a finetune: each
    version's row adds up only its own intervals; the finetune's row is not the counters since
    the server started under the finetune's name."""
    srv = SwapServer("/m/public", "/m/target")
    srv.accept["/r/ft/out/final"] = 2
    pool = HostPool(local_config(tmp_path / "host"))
    try:
        host = await pool.ensure("local")
        s = Session.parse({"run_id": "serve-pub-1", "host": "local", "drafter": "/m/public",
                           "port": srv.port, "started": T0, "swappable": True, "k": 3})
        assert s is not None
        record_session({"run_id": "serve-pub-1", "host": "local", "drafter": "/m/public",
                        "port": srv.port, "metrics": s.metrics, "started": T0,
                        "swappable": True, "k": 3})
        m = Measurer()
        for _ in range(3):     # the public drafter: 1 accepted per draft
            srv.generate(400)
            await m.measure(s, host)
        with srv._lock:        # a swap, as the routes make it
            srv.serving, srv.version = "/r/ft/out/final", "final@cd"
        record_swap({"run_id": "serve-pub-1", "host": "local", "url": s.base_url,
                     "drafter": "/r/ft/out/final", "weight_version": "final@cd"})
        await m.measure(s, host)
        for _ in range(3):     # the finetune: 2 accepted per draft
            srv.generate(300)
            await m.measure(s, host)
        # swapped there and back between two scrapes: the same version on both sides
        for drafter, version in (("/m/public", "public@ef"), ("/r/ft/out/final", "final@cd")):
            with srv._lock:
                srv.serving = drafter
            record_swap({"run_id": "serve-pub-1", "host": "local", "url": s.base_url,
                         "drafter": drafter, "weight_version": version, "t": time.time()})
            srv.generate(400)
        await m.measure(s, host)
    finally:
        srv.close()
        await pool.close()
    by = {r.weight_version: r for r in table()}
    assert by["default"].acceptance_length == pytest.approx(2.0)
    assert by["default"].drafter == "/m/public"
    assert by["final@cd"].acceptance_length == pytest.approx(3.0)
    assert by["final@cd"].drafter == "/r/ft/out/final"
    assert by["final@cd"].drafts == 300      # three intervals of 100 drafts, none of default's
    assert by["final@cd"].seconds is not None and by["final@cd"].seconds > 0


async def test_measure_now_with_nothing_to_measure_says_so(tmp_path: Path) -> None:
    app = local_app(local_config(tmp_path / "host"))
    async with app.run_test(size=(120, 36)) as pilot:
        app.push_screen(CompareScreen(measure=False))
        await pilot.pause()
        await pilot.press("r")
        await wait_for(pilot, lambda: any("Nothing to measure" in str(n.message)
                                          for n in app._notifications))  # noqa: SLF001
        said = [str(n.message) for n in app._notifications]  # noqa: SLF001
        assert "Nothing to measure: no serving session is recorded" in said[-1], said
        record_session({"run_id": "serve-gone-1", "host": "local", "drafter": "/m/x",
                        "port": 8000, "started": T0})
        app.clear_notifications()
        await pilot.press("r")
        await wait_for(pilot, lambda: len(app._notifications) > 0)  # noqa: SLF001
        said = [str(n.message) for n in app._notifications]  # noqa: SLF001
        assert "none of the 1 recorded serving sessions is running" in said[-1], said


def test_the_provenance_column_is_whole(capsys: pytest.CaptureFixture[str]) -> None:
    prov = {"run": "/srv/runs/finetune-20261205-080000-ab12/out", "step": 150,
            "finetune": {"path": "/models/public-eagle3"}}
    record_session({"run_id": "serve-ft-1", "host": "local", "k": 3, "metrics": URL,
                    "drafter": "/srv/runs/finetune-20261205-080000-ab12/out/final",
                    "started": T0, "provenance": prov})
    assert cli_main(["compare"]) == 0
    out = capsys.readouterr().out
    assert "finetune-20261205-080000-ab12@150 < public-eagle3" in out, out
    assert out.splitlines()[0].split()[:3] == ["DRAFTER", "VERSION", "PROVENANCE"]


def test_forget_drops_a_serving_runs_records_and_keeps_every_other_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`compare --forget RUN`: the run's session, swaps, scrapes and replays go; another run's
    records and the damaged lines stay byte for byte; an unknown run is named, nothing lost."""
    write_journal(with_damage=True)
    record_session({"run_id": "serve-keep-5", "host": "local", "drafter": "/m/keep", "k": 3,
                    "port": 8001, "started": T0 + 5})
    record_scrape("serve-keep-5", {"host": "local", "url": URL, "t": T0 + 6,
                                   "total": total(10, 10)})
    files = (sessions_path(), swaps_path(), results_path())
    before = {p: p.read_bytes().splitlines(keepends=True) for p in files}
    assert cli_main(["compare", "--forget", "serve-nope"]) == 1
    assert "no serving session recorded for serve-nope" in capsys.readouterr().err
    assert {p: p.read_bytes().splitlines(keepends=True) for p in files} == before
    assert cli_main(["compare", "--forget", "serve-pub-1"]) == 0
    assert "forgot serve-pub-1:" in capsys.readouterr().out

    def of_pub(line: bytes) -> bool:
        try:
            return json.loads(line).get("run_id") == "serve-pub-1"
        except (ValueError, AttributeError, RecursionError):
            return False
    for p in files:
        assert p.read_bytes().splitlines(keepends=True) == \
            [ln for ln in before[p] if not of_pub(ln)], p.name
    left = {r.run_id for r in table()}
    assert "serve-pub-1" not in left and "serve-keep-5" in left


def test_compare_says_once_how_many_damaged_lines_it_skipped(tmp_path: Path) -> None:
    """A journal with damaged lines, through the real CLI: the rows it can read, and one line
    on stderr naming each file and how many lines were skipped."""
    data = tmp_path / "xdg-data" / "eagle3-console"
    data.mkdir(parents=True)
    session = {"run_id": "serve-pub-1", "host": "local", "drafter": "/m/public", "k": 3,
               "metrics": URL, "started": T0}
    (data / "serving.jsonl").write_text(json.dumps(session) + '\n{"run_id": \n{"run_id": 5}\n')
    (data / "serving-metrics.jsonl").write_bytes(
        json.dumps({"run_id": "serve-pub-1", "host": "local", "url": URL, "t": T0 + 60,
                    "total": total(100, 150)}).encode() + b"\n\xff\xfe cut\n\n")
    said = ["warning: serving.jsonl: 2 damaged lines skipped; serving-metrics.jsonl: 1 "
            "damaged line skipped"]
    r = console(tmp_path, "compare")
    assert r.returncode == 0 and r.stderr.splitlines() == said, r.stderr
    assert "/m/public" in r.stdout and " 2.50 " in r.stdout, r.stdout
    r = console(tmp_path, "compare", "--json")
    assert r.returncode == 0 and r.stderr.splitlines() == said, r.stderr
    assert [json.loads(ln)["acceptance_length"] for ln in r.stdout.splitlines()] == [2.5]


def test_every_record_written_reads_back_equal() -> None:
    """Each record type, every field set, through record() and the readers: the same record,
    in its own file, and nothing skipped."""
    prov = Provenance(written_by="training", run="/r/ft/out", step=30, held_out_tau=2.5,
                      format="eagle", finetune="/m/public", derived_from="/m/src")
    fig = Figures(drafts=100, draft_tokens=300, accepted=150, acceptance_length=2.5,
                  acceptance_rate=0.5, per_position=(0.9, 0.5, 0.1), generation_tokens=400,
                  generation_tokens_per_s=80.0, seconds=30.0, prompt_tokens_per_s=12.5)
    session = Session(run_id="serve-x-1", host="local", drafter="/m/public", verifier="/m/t",
                      k=3, port=8001, metrics="http://127.0.0.1:8001/metrics", started=T0,
                      swappable=True, provenance=prov, tp=2, format="eagle",
                      draft_vocab_size=96, extra=("--max-model-len", "512"))
    swap = SwapRecord(run_id="serve-x-1", host="local", url="http://127.0.0.1:8001",
                      drafter="/r/ft/out/final", weight_version="final@ab", t=T0 + 5,
                      provenance=prov, previous="/m/public", previous_version="default",
                      seconds=0.25)
    scrape = Scrape(run_id="serve-x-1", host="local", url=session.metrics, t=T0 + 9, series=2,
                    weight_version="final@ab", drafter="/r/ft/out/final", steady=True,
                    total=fig, interval=Figures(drafts=1, accepted=0, per_position=(0.0,)),
                    reset=True, running=1, waiting=2, kv_cache_usage_pct=12.5)
    failed = Scrape(run_id="serve-x-1", host="local", url=session.metrics, t=T0 + 10,
                    error="connection refused")
    bench = BenchRun(run_id="serve-x-1", host="local", url=session.metrics, t=T0 + 20,
                     drafter="/r/ft/out/final", weight_version="final@ab",
                     records_disagree="records say otherwise", prompts=4, max_tokens=64,
                     stop="eos", concurrency=2, completion_tokens=200, seconds=2.5,
                     generation_tokens_per_s=80.0, latency_median=0.5, latency_max=0.75,
                     total=fig, other_traffic=True,
                     requests_total=SpecCounts(2.5, drafts=10, accepted=15, draft_tokens=30))
    for rec in (session, swap, scrape, failed, bench):
        record(rec)
    got = load()
    assert got.sessions == [session] and got.swaps == [swap]
    assert got.measurements == [scrape, failed, bench]
    assert got.notice() is None
    assert [len(p.read_text().splitlines()) for p in (sessions_path(), swaps_path(),
                                                       results_path())] == [1, 1, 3]
