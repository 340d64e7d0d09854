"""`eagle3-console follow` as a person reads it: one compact line per training step (step/total,
loss, acc_0, tau, ETA) in fixed columns, a line of its own for each checkpoint's served
acceptance (--eval-server), and `--json` keeping every field of every event, run as a real
subprocess on the recorded demo finetunes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.runs_registry import recorded_events, write_run

STEP = re.compile(r"^step +(\d+)/150  loss (\d+\.\d{3})  acc_0 (\d\.\d{3})  tau (\d\.\d{3})"
                  r"(  ETA \d+:\d\d)?$")


def follow(tmp_path: Path, *extra: str, name: str = "finetune"
           ) -> subprocess.CompletedProcess[str]:
    lines = recorded_events(name)
    write_run(tmp_path, "finetune-1", lines, status="succeeded", start=1.0, end=2.0,
              exit_code=0, train_json=False)
    (tmp_path / "runs" / "finetune-1" / "output.log").write_text("a line of stderr\n")
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.local]\npython = "{sys.executable}"\nroot = "{tmp_path}"\n')
    return subprocess.run([sys.executable, "-m", "console", "--config", str(cfg), "follow",
                           "finetune-1", *extra], capture_output=True, text=True, timeout=120)


def metrics_by_step() -> dict[int, dict[str, float]]:
    out = {}
    for ln in recorded_events():
        ev = json.loads(ln)
        if ev["kind"] == "metric":
            out[ev["step"]] = ev["values"]
    return out


def test_follow_prints_one_compact_line_per_step(tmp_path: Path) -> None:
    r = follow(tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    steps = [ln for ln in out if ln.startswith("step ")]
    assert len(steps) == 150 and not any(ln.startswith("[train]") for ln in out)
    want = metrics_by_step()
    for ln in steps:
        m = STEP.match(ln)
        assert m, ln
        step = int(m[1])
        assert m[2] == f"{want[step]['loss']:.3f}" and m[3] == f"{want[step]['acc_0']:.3f}"
        assert m[4] == f"{want[step]['tau']:.3f}"
    assert [int(STEP.match(ln)[1]) for ln in steps] == list(range(1, 151))  # type: ignore[index]
    assert "ETA" in steps[36] and "ETA" not in steps[-1]        # none left at the end
    # fixed columns: every step line is as long as the next, loss starts in one column
    assert len({ln.index("loss") for ln in steps}) == 1
    assert max(len(ln) for ln in out) <= 160, max(out, key=len)
    assert "a line of stderr" in out
    assert any(ln.startswith("result: ") and "final /data/runs/finetune/out/final" in ln
               for ln in out)


def test_follow_json_keeps_every_field(tmp_path: Path) -> None:
    r = follow(tmp_path, "--json")
    assert r.returncode == 0, r.stderr
    objs = [json.loads(ln) for ln in r.stdout.splitlines()]
    recorded = [json.loads(ln) for ln in recorded_events()]
    assert [o for o in objs if o.get("kind") != "output"] == recorded   # every event, whole
    assert {"kind": "output", "file": "output.log", "offset": 0,
            "text": "a line of stderr"} in objs
    first = next(o for o in objs if o["kind"] == "metric")
    assert len(first["values"]) >= 20 and {"grad_norm", "lr", "loss_3"} <= set(first["values"])


def test_follow_prints_served_acceptance_on_a_line_of_its_own(tmp_path: Path) -> None:
    """A finetune recorded with --eval-server: each checkpoint's `served acceptance` is one line
    (acceptance length and per position), after its step's line; the step lines are unchanged."""
    r = follow(tmp_path, name="finetune-served")
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    served = {e["step"]: e["values"] for e in map(json.loads, recorded_events("finetune-served"))
              if e["kind"] == "metric" and e.get("name") == "served acceptance"}
    got = [ln for ln in out if ln.startswith("served acceptance at step ")]
    assert len(got) == len(served) == 3
    for ln, (step, v) in zip(got, sorted(served.items()), strict=True):
        pos = " ".join(f"{v[f'pos_{i}']:.3f}" for i in range(3))
        assert ln == f"served acceptance at step {step}: {v['acceptance_length']:.3f}  pos " \
                     f"{pos}  ({v['prompts']} prompts)"
        assert out.index(ln) > next(i for i, x in enumerate(out)
                                    if (m := STEP.match(x)) and int(m[1]) == step)
    assert sum(bool(STEP.match(ln)) for ln in out) == 150


def test_follow_shows_served_positions_in_order_and_skips_other_keys(tmp_path: Path) -> None:
    """A served acceptance whose values hold keys that look like positions but are not (`pos_x`,
    `pos_²`, `pos_`) still prints: positions in number order (pos_10 after pos_2), the rest only
    in --json."""
    lines = recorded_events("finetune-served")
    first = next(i for i, ln in enumerate(lines) if '"served acceptance"' in ln)
    ev = json.loads(lines[first])
    keep = {k: v for k, v in ev["values"].items() if not k.startswith("pos_")}
    ev["values"] = {**keep, "pos_x": 0.9, "pos_10": 0.125, "pos_\u00b2": 0.8, "pos_": 0.7,
                    "pos_2": 0.25, "pos_0": 0.5}
    lines[first] = json.dumps(ev)
    write_run(tmp_path, "finetune-1", lines, status="succeeded", start=1.0, end=2.0,
              exit_code=0, train_json=False)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.local]\npython = "{sys.executable}"\nroot = "{tmp_path}"\n')
    r = subprocess.run([sys.executable, "-m", "console", "--config", str(cfg), "follow",
                        "finetune-1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    got = [ln for ln in r.stdout.splitlines() if ln.startswith("served acceptance at step ")]
    assert len(got) == 3
    assert f"{ev['values']['acceptance_length']:.3f}  pos 0.500 0.250 0.125  (" in got[0], got[0]


def test_figures_of_no_step_are_said_without_one() -> None:
    """A stream producer's pool figures belong to no step: `stream producer: pool_samples 3
    ...`, never `at step None`; a named metric of a step keeps it."""
    from console.commands.follow import named_metric
    from engine import events
    pool = events.Metric(t=1.0, cmd="stream-put", step=None, name="stream producer",
                         values={"pool_samples": 3, "pool_bytes": 1024, "paused_s": 0.5})
    assert named_metric(pool) == "stream producer: pool_samples 3  pool_bytes 1024  paused_s 0.500"
    waits = events.Metric(t=1.0, cmd="train", step=7, name="stream trainer",
                          values={"wait_s": 1.25})
    assert named_metric(waits) == "stream trainer at step 7: wait_s 1.250"
