"""What a new user reads: the doctor report (CLI and Host pane) lists each package once in one
column; `follow` prints one line per training step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from console.hosts.doctor_report import render
from tests.paths import REPO


def test_doctor_report_lists_torch_once_in_one_column() -> None:
    r = subprocess.run([sys.executable, "-m", "engine", "doctor", "--json"], cwd=REPO,
                       capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(r.stdout)
    report["gpus"] = [{"index": 0, "name": "NVIDIA H200", "memory_total": 150 * 2**30}]
    lines = render(report).splitlines()[1:]
    labels = [ln.split()[0] for ln in lines if not ln.startswith(" ")]
    assert labels.count("torch") == 1 and "safetensors" in labels and "disk" in labels
    assert labels.count("stream") == 1  # the stream extra's Mooncake wheel, whatever it is here
    # every value starts in the same column, after the longest label and two spaces
    width = max(len(label) for label in labels) + 2
    for ln in lines:
        assert ln[width - 2:width] == "  " and ln[width] != " ", ln
    assert any("[0] NVIDIA H200  150 GiB" in ln for ln in lines)


def test_follow_prints_one_line_per_training_step(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from console.cli import main as cli_main
    from tests.runs_registry import recorded_events, write_run

    lines = recorded_events()
    write_run(tmp_path, "finetune-1", lines, status="succeeded", start=1.0, end=2.0,
              exit_code=0, train_json=False)
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.local]\npython = "{sys.executable}"\nroot = "{tmp_path}"\n')
    assert cli_main(["--config", str(cfg), "follow", "finetune-1"]) == 0
    out = capsys.readouterr().out.splitlines()
    steps = [ln for ln in out if ln.startswith("step ")]
    assert len(steps) == 150 and not any(ln.startswith("[train]") for ln in out)
    assert steps[36].startswith("step  37/150  loss ") and " ETA " in steps[36]
    assert steps[-1].startswith("step 150/150")
