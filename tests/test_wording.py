"""What a new user reads: the doctor report (CLI and Host pane) lists each package once in one
column."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from console.commands.doctor import render

REPO = Path(__file__).resolve().parent.parent


def test_doctor_report_lists_torch_once_in_one_column() -> None:
    r = subprocess.run([sys.executable, "-m", "engine", "doctor", "--json"], cwd=REPO,
                       capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(r.stdout)
    report["gpus"] = [{"index": 0, "name": "NVIDIA H200", "memory_total": 150 * 2**30}]
    lines = render(report).splitlines()[1:]
    labels = [ln.split()[0] for ln in lines if not ln.startswith(" ")]
    assert labels.count("torch") == 1 and "safetensors" in labels and "disk" in labels
    # every value starts in the same column, after the longest label and two spaces
    width = max(len(label) for label in labels) + 2
    for ln in lines:
        assert ln[width - 2:width] == "  " and ln[width] != " ", ln
    assert any("[0] NVIDIA H200  150 GiB" in ln for ln in lines)
