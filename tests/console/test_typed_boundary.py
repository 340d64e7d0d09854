"""What a host sends is parsed once into typed records.

The engine writes no NaN or infinity; an events.jsonl that holds them anyway (an older engine, a
hand-edited file, a hostile host) crashes neither the run detail plot, the Runs pane nor
`follow`; event lines come out of engine/events.py as frozen records with finite numbers and
bounded strings; and the console reads run records, run statuses and events through the parsers
only (a grep over console/ below)."""

from __future__ import annotations

import io
import json
import re
import sys
import tokenize
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from console.checkpoints.results import (
    Check,
    ConvertSummary,
    InspectReport,
    convert_line,
    parse_scan,
)
from console.errors import ConsoleError
from console.panes.runs import RunsPane
from console.screens.run_detail import RunDetailScreen
from console.widgets.line_plot import LinePlot
from engine import events
from tests.console_cli import console
from tests.panes import RUNNING, feed_of
from tests.paths import REPO
from tests.runs_registry import (
    event_time,
    local_app,
    local_config,
    recorded_events,
    upto_step,
    write_run,
)
from tests.waiting import wait_for

SIZE = (120, 40)
pytestmark = pytest.mark.usefixtures("utc")   # times on screen are local times

#: an older engine's json.dumps wrote these for a diverged loss; 1e400 reads as infinity
NAN_METRIC = ('{"v":1,"kind":"metric","t":%f,"cmd":"train","step":61,'
              '"values":{"loss":NaN,"acc_0":0.5,"tau":Infinity}}')
HUGE_ETA = ('{"v":1,"kind":"progress","t":%f,"cmd":"train","done":61,"total":150,'
            '"unit":"step","desc":"train","eta_s":1e400,"rate":NaN}')


def diverged(lines: list[str], *extra: str) -> list[str]:
    t = event_time(lines[-1]) + 1.0
    return [*lines, *(x % (t + i / 10) for i, x in enumerate(extra))]


async def open_diverged(pilot: Pilot[Any], n_lines: int, detail: bool) -> None:
    """The Runs pane with the running run read to its end, then (detail) its run detail."""
    app = pilot.app
    await pilot.press("5")
    await wait_for(pilot, lambda: (f := feed_of(pilot, RUNNING)) is not None
                   and f.progress.events == n_lines)
    pane = app.screen.query_one(RunsPane)
    pane.refresh_view(force=True)   # the PROGRESS column: steps and an ETA (fmt_duration)
    await pilot.pause()
    if detail:
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RunDetailScreen))
        screen = app.screen
        assert isinstance(screen, RunDetailScreen)
        screen.refresh_view(force=True)          # the plots (braille_grid) and the ETA
    await pilot.pause(0.3)
    assert app.is_running and app.return_code is None


@pytest.mark.parametrize("extra, detail", [((HUGE_ETA,), False), ((NAN_METRIC,), True),
                                           ((NAN_METRIC, HUGE_ETA), True)],
                         ids=["eta-runs-pane", "nan-run-detail", "both"])
async def test_nan_metric_or_infinite_eta_keeps_the_runs_pane_and_run_detail_up(
        tmp_path: Path, extra: tuple[str, ...], detail: bool) -> None:
    from tests.replay import FrozenClock
    root = tmp_path / "root"
    lines = diverged(upto_step(recorded_events(), 60), *extra)
    write_run(root, RUNNING, lines, status="running", start=event_time(lines[0]) - 3.0)
    app = local_app(local_config(root), FrozenClock(event_time(lines[-1]) + 0.4))
    async with app.run_test(size=SIZE) as pilot:
        await open_diverged(pilot, len(lines), detail)
        feed = feed_of(pilot, RUNNING)
        assert feed is not None
        assert feed.progress.eta_s is None or feed.progress.eta_s < 1e9
        if NAN_METRIC in extra:
            assert feed.progress.last_metrics["loss"] is None
            assert all(v == v for _, v in feed.progress.points("loss"))  # no NaN point kept
        if detail:
            assert app.screen.query(LinePlot)


def test_follow_prints_a_diverged_step_without_a_traceback(tmp_path: Path) -> None:
    lines = diverged(upto_step(recorded_events(), 2), NAN_METRIC, HUGE_ETA)
    root = tmp_path / "root"
    write_run(root, "finetune-1", lines, status="succeeded", start=1.0, end=2.0, exit_code=0,
              train_json=False)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.local]\npython = "{sys.executable}"\nroot = "{root}"\n')
    r = console(tmp_path, "--config", str(cfg), "follow", "finetune-1")
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 0, r.stderr
    last = r.stdout.splitlines()[-1]
    assert re.fullmatch(r"step +61/150  loss -  acc_0 0\.500  tau -", last), last


# -- the records ----------------------------------------------------------------------------

def test_engine_writes_null_and_a_warning_for_a_non_finite_metric() -> None:
    out = io.StringIO()
    em = events.Emitter("train", json_mode=True, out=out, err=io.StringIO())
    em.metric({"loss": float("nan"), "tau": float("inf"), "acc_0": 0.5}, step=7)
    em.result({"eval": {"tau": float("-inf")}})
    lines = out.getvalue().splitlines()

    def refuse(word: str) -> None:
        raise AssertionError(f"{word} in the event stream")

    objs = [json.loads(ln, parse_constant=refuse) for ln in lines]   # strict JSON only
    assert objs[0]["values"] == {"loss": None, "tau": None, "acc_0": 0.5}
    assert objs[1]["kind"] == "log" and objs[1]["level"] == "warning"
    assert "loss" in objs[1]["msg"] and "tau" in objs[1]["msg"] and "step 7" in objs[1]["msg"]
    assert objs[2]["data"] == {"eval": {"tau": None}}


def test_parse_returns_typed_records_with_finite_numbers_and_bounded_strings() -> None:
    def line(**kw: Any) -> str:
        return json.dumps({"v": 1, "t": 3.0, "cmd": "train", **kw})

    p = events.parse(line(kind="progress", done=5, total=10, unit="step", eta_s=float("nan"),
                          rate=-1.0))
    assert p == events.Progress(3.0, "train", done=5, total=10, unit="step", eta_s=None,
                                rate=None)
    m = events.parse(line(kind="metric", step=2, values={"loss": float("inf"), "n": 3}))
    assert isinstance(m, events.Metric) and dict(m.values) == {"loss": None, "n": 3}
    log = events.parse(line(kind="log", level="info", msg="x" * 10 ** 6))
    assert isinstance(log, events.Log) and len(log.msg) == events.MAX_TEXT
    assert events.parse(line(kind="metric", values={"loss": "high"})) is None
    assert events.parse(line(kind="progress", done=True)) is None
    assert events.parse(line(kind="error", msg=None)) is None
    assert events.parse("{" + " " * events.MAX_LINE + "}") is None
    res = events.parse(line(kind="result", data={"eval": [float("nan"), 1.5]}))
    assert isinstance(res, events.Result) and res.data == {"eval": [None, 1.5]}
    with pytest.raises(events.MalformedEvent, match="metric: values is not an object"):
        events.decode(line(kind="metric", values=[1]))
    big = events.parse(line(kind="metric", step=1, values={"n": 10 ** 400}))
    assert isinstance(big, events.Metric) and big.values["n"] is None


def test_checkpoint_answers_are_records_and_bad_fields_are_one_line_errors() -> None:
    report = InspectReport.parse({"ok": False, "checks": [{"name": "keys", "ok": False,
                                                           "detail": "missing fc"}, "junk"],
                                  "key_style": "eagle", "config": {"verifier": "org/t",
                                                                   "draft_vocab_size": True},
                                  "provenance": {"step": "x"}})
    assert not report.ok and report.first_failed() == Check("keys", False, "missing fc")
    assert report.verifier == "org/t" and report.draft_vocab_size is None and report.step is None
    assert report.check_lines() == ["FAIL  keys                  missing fc"]
    summary = ConvertSummary.parse({"tensors": 7, "bytes": 3 * 2**20, "seconds": float("nan"),
                                    "source_format": "eagle"}, "/d/out")
    assert convert_line(summary, "vllm") == "converted to vllm: /d/out (7 tensors, 3.0 MiB, 0.0 s)"
    found, missing = parse_scan({"found": [{"path": "/a", "source": "run r", "mtime": 1.0,
                                            "bytes": 5}], "missing": [["/b", "absent"]]}, "h")
    assert [c.name for c in found] == ["a"] and missing == [("/b", "absent")]
    with pytest.raises(ConsoleError, match=r"^h: the checkpoint scan's entry 0 is not a"):
        parse_scan({"found": [{"path": "/a", "source": "run r", "mtime": "soon"}]}, "h")


# -- the grep: no hand-read host data outside the parsers -------------------------------------

CONSOLE = REPO / "console"
#: the modules that parse what a host sends, and the host side itself (it writes run.json)
PARSERS = {"console/scheduler/run_record.py", "console/scheduler/run_status.py"}
HOST_SIDE = "console/hostside/"
#: folders where no `.get(` may read a host's, a server's or the journal's data: only their
#: parser modules (below) look fields up in raw JSON
CHECKED_DIRS = ["console/checkpoints/"]
GET_PARSERS = {"console/checkpoints/journal.py", "console/checkpoints/results.py",
               "console/checkpoints/answers.py", "console/checkpoints/drafter_facts.py",
               "console/checkpoints/prompts.py"}
STATUS_WORDS = {"pending", "running", "succeeded", "failed", "stopped", "lost", "corrupt"}
#: the same words meaning something else: vLLM's scheduler gauges, a host's connection state
OTHER_MEANING = {("console/logs/vllm_log.py", "running"), ("console/logs/vllm_log.py", "pending"),
                 ("console/logs/vllm_metrics.py", "running"), ("console/hosts/host.py", "failed"),
                 ("console/checkpoints/journal.py", "running"),
                 ("console/errors.py", "failed")}

#: where no dict is read with `.get(` at all: the widgets and the checkpoints pane draw typed
#: records, and the pane's model decides on them
NO_GET = ("console/widgets/", "console/panes/checkpoints.py", "console/checkpoints/model.py")
#: lookups there in the console's own tables and caches (module constants need no entry)
OWN_TABLES = {("console/widgets/fleet_table.py", "mon.gpu_error"),
              ("console/widgets/fleet_table.py", "mon.history"),
              ("console/widgets/host_list.py", "notes"),
              ("console/widgets/log_view.py", "self._strips"),
              ("console/widgets/log_view.py", "self._style_cache"),
              ("console/widgets/meter_base.py", "self._styles")}


def hand_read(rel: str, src: str) -> bool:
    """Whether a line of `rel` reads a dict with `.get(` where only records may be read."""
    return rel.startswith(NO_GET) and any(
        not re.fullmatch(r"[A-Z][A-Z0-9_]*", m[1]) and (rel, m[1]) not in OWN_TABLES
        for m in re.finditer(r"([\w.]*)\.get\(", src))


def console_sources() -> list[tuple[str, str]]:
    out = []
    for path in sorted(CONSOLE.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel in PARSERS or rel.startswith(HOST_SIDE):
            continue
        out.append((rel, path.read_text(encoding="utf-8")))
    return out


def test_console_reads_host_data_only_through_the_parsers() -> None:
    found = []
    for rel, text in console_sources():
        for n, src in enumerate(text.splitlines(), 1):
            if re.search(r"\.raw\b|\._source\b|\bev\.get\(", src) or hand_read(rel, src):
                found.append(f"{rel}:{n}: {src.strip()}")
            if ".get(" in src and rel not in GET_PARSERS and \
                    any(rel.startswith(d) for d in CHECKED_DIRS):
                found.append(f"{rel}:{n}: .get( outside the parsers: {src.strip()}")
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.STRING and tok.string.strip("\"'") in STATUS_WORDS \
                    and tok.string[0] in "\"'" and \
                    (rel, tok.string.strip("\"'")) not in OTHER_MEANING:
                found.append(f"{rel}:{tok.start[0]}: status literal {tok.string}")
    assert not found, "\n".join(found)
