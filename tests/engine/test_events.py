"""The event stream contract: encode/parse, versioning, throttling, sinks, the CLI's --events."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from engine import events
from engine.events import Emitter, encode, parse
from tests.drafters import write_drafter
from tests.paths import REPO

ONE_OF_EACH: dict[str, tuple[dict[str, object], object]] = {
    "progress": ({"done": 3, "total": 9, "unit": "step", "desc": "train", "eta_s": 1.5,
                  "rate": 2.0}, events.Progress(5.0, "train", 3, 9, "step", "train", 1.5, 2.0)),
    "metric": ({"step": 4, "values": {"loss": 1.25}},
               events.Metric(5.0, "train", 4, {"loss": 1.25})),
    "log": ({"level": "warning", "msg": "hm"}, events.Log(5.0, "train", "warning", "hm")),
    "result": ({"data": {"x": 1}}, events.Result(5.0, "train", {"x": 1})),
    "error": ({"msg": "no", "type": "EngineError"},
              events.Error(5.0, "train", "no", "EngineError")),
    "sample": ({"gpus": [], "host": None}, events.Sample(5.0, "train",
                                                         {"gpus": [], "host": None})),
}


def test_round_trip_every_kind() -> None:
    assert set(ONE_OF_EACH) == set(events.KINDS)
    for kind, (payload, record) in ONE_OF_EACH.items():
        ev = parse(encode(kind, "train", payload, t=5.0))
        assert ev == record and ev.kind == kind


def test_parse_rejects_non_events() -> None:
    assert parse("hello") is None
    assert parse("{not json") is None
    assert parse(json.dumps({"v": 1, "kind": "nope"})) is None
    assert parse(json.dumps({"v": events.EVENTS_VERSION + 1, "kind": "log"})) is None
    assert parse(json.dumps([1, 2])) is None
    assert parse(b'{"v":1,"kind":"log","t":1,"cmd":"x","msg":"\xff"}') is not None


def test_emitter_json_mode_and_sink(tmp_path: Path) -> None:
    out = io.StringIO()
    ev = Emitter("convert", json_mode=True, out=out, err=io.StringIO())
    ev.add_sink(str(tmp_path / "events.jsonl"))
    for i in range(1000):
        ev.progress(i + 1, 1000, unit="tensor", desc="convert")
    ev.metric({"loss": 1.5}, step=3)
    ev.result({"ok": True})
    ev.close()
    lines = out.getvalue().splitlines()
    parsed = [parse(line) for line in lines]
    assert all(p is not None for p in parsed)
    progress = [p for p in parsed if p and p.kind == "progress"]
    assert 1 <= len(progress) < 100          # throttled, but the final one always arrives
    assert isinstance(progress[-1], events.Progress) and progress[-1].done == 1000
    assert (tmp_path / "events.jsonl").read_text().splitlines() == lines


def test_appending_sink_cuts_a_line_torn_by_a_kill(tmp_path: Path) -> None:
    # A run killed mid-write leaves half a line; the resumed run must not glue its first event
    # onto it (that line would parse as nothing and the event would be lost).
    path = tmp_path / "events.jsonl"
    whole = encode("metric", "train", {"step": 1, "values": {"loss": 2.0}})
    torn = encode("metric", "train", {"step": 2, "values": {"loss": 1.9}})[:37]
    path.write_text(whole + "\n" + "x" * 9000 + "\n" + torn, encoding="utf-8")
    ev = Emitter("train", err=io.StringIO())
    ev.add_sink(str(path))
    ev.metric({"loss": 1.8}, step=2)
    ev.close()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == whole and lines[1] == "x" * 9000
    resumed = parse(lines[2])
    assert len(lines) == 3 and isinstance(resumed, events.Metric) and resumed.step == 2
    events.drop_torn_tail(str(path))                      # a whole file is left as it is
    assert path.read_text(encoding="utf-8").splitlines() == lines
    events.drop_torn_tail(str(tmp_path / "absent.jsonl"))  # and a missing one is not created
    assert not (tmp_path / "absent.jsonl").exists()


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_to_a_file_or_pipe_is_whole_lines_without_carriage_returns() -> None:
    err = io.StringIO()                       # not a terminal: what `2> log` or a pipe is
    ev = Emitter("eval", err=err)
    for i in range(101):
        ev.progress(i, 100, unit="sample", desc="eval", force=True)
    text = err.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert 10 <= len(lines) <= 12 and "100/100 sample" in lines[-1]
    tty = Tty()                              # a terminal still gets the redrawn bar
    ev = Emitter("eval", err=tty)
    for i in range(101):
        ev.progress(i, 100, unit="sample", desc="eval", force=True)
    assert tty.getvalue().count("\r") == 101


def test_an_engine_commands_progress_through_a_pipe_has_no_carriage_returns(
        tmp_path: Path) -> None:
    """`engine convert` here (`engine eval` and the others share the Emitter): stderr a pipe."""
    write_drafter(tmp_path / "src")
    r = subprocess.run([sys.executable, "-m", "engine", "convert", str(tmp_path / "src"),
                        str(tmp_path / "dst"), "--to", "sglang"], cwd=REPO,
                       capture_output=True, timeout=120)   # bytes: text mode would hide \r
    assert r.returncode == 0, r.stderr
    assert b"\r" not in r.stderr and b"convert [" in r.stderr


def test_human_mode_draws_bar_on_stderr() -> None:
    out, err = io.StringIO(), io.StringIO()
    ev = Emitter("x", out=out, err=err)
    ev.progress(5, 5, unit="step", desc="train")
    ev.log("hello")
    assert out.getvalue() == ""
    assert "[" in err.getvalue() and "5/5 step" in err.getvalue() and "hello" in err.getvalue()


def test_cli_usage_error_one_line_exit_2() -> None:
    r = subprocess.run([sys.executable, "-m", "engine", "doctor", "--bogus"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "unrecognized arguments: --bogus" in r.stderr


def test_cli_events_mode_writes_only_json() -> None:
    argv = [sys.executable, "-m", "engine", "doctor", "--events", "--path", "/nonexistent"]
    r = subprocess.run(argv,
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    evs = [parse(line) for line in r.stdout.splitlines()]
    assert evs and all(evs)
    data = next(e for e in evs if isinstance(e, events.Result)).data
    assert data["disk"]["error"]
    assert data["packages"]["torch"]


def test_a_named_metric_keeps_its_name_and_a_training_step_has_none() -> None:
    """train --eval-server's `served acceptance` events are metrics with a name; a step's
    metrics are written as before (no name field) and read with name ""."""
    out = io.StringIO()
    ev = Emitter("train", json_mode=True, out=out, err=io.StringIO())
    ev.metric({"loss": 1.5}, step=3)
    ev.metric({"acceptance_length": 2.5, "pos_0": 0.75}, step=50, name=events.SERVED)
    step, served = out.getvalue().splitlines()
    assert "name" not in json.loads(step)
    assert parse(step) == events.Metric(json.loads(step)["t"], "train", 3, {"loss": 1.5}, "")
    got = parse(served)
    assert isinstance(got, events.Metric) and got.name == "served acceptance"
    assert (got.step, dict(got.values)) == (50, {"acceptance_length": 2.5, "pos_0": 0.75})
    bad = encode("metric", "train", {"step": 1, "values": {}, "name": 7})
    assert parse(bad) is None
    try:
        events.decode(bad)
    except events.MalformedEvent as e:
        assert "metric: name is not a string" in str(e)
    else:
        raise AssertionError("a name that is not a string was accepted")
