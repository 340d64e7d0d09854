"""Test helpers: a host whose files say hostile things. A real runs registry, checkpoint folders,
a log and a host python whose names and contents hold Textual markup (`[/b]`, `[a=b=c]`), click
actions (`[@click=app.quit]`, `[@click=app.screenshot(...)]`), terminal escape sequences (OSC 52
clipboard write, OSC 0 title, ESC[2J clear screen), other control characters and non-finite
numbers (NaN, 1e400) - everything a host can send the console, written where the console reads
it. The console must show all of it as text and interpret none of it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from console.settings.config import Config, HostConfig
from tests.runs_registry import local_config, write_run

#: terminal escapes a host could send: a clipboard write, a window title, a clear screen
OSC52 = "\x1b]52;c;cHduZWQ=\x07"
OSC0 = "\x1b]0;pwned\x07"
CLEAR = "\x1b[2J"
ESCAPES = OSC52 + OSC0 + CLEAR
#: ran as the app: quits it when its text is clicked
QUIT_RUN = "[@click=app.quit]boom"
#: its text crashed `x` (the stop question): `[a=b=c]` is not valid markup
BAD_MARKUP_RUN = "[a=b=c]boom"
#: a closing tag with nothing open: a MarkupError wherever it is parsed
CLOSE = "[/b]"
#: a checkpoint folder whose name, shown as markup, writes a file when clicked
SCREENSHOT = "pwned.svg"
CLICK_CKPT = f"[@click=app.screenshot('{SCREENSHOT}','.')]ck"
#: what the bad host's python prints before it fails
STDERR = "[/usr/lib] " + ESCAPES


@dataclass
class Hostile:
    root: Path          # the local host's root: ROOT/runs holds the runs
    shelf: Path         # a configured checkpoints folder
    log: Path           # a configured log
    python: Path        # the `evil` host's python: prints STDERR and fails
    config: Config


def events_lines(t0: float) -> list[str]:
    """An engine stream with a NaN loss, an ETA of 1e400, and log and error events whose
    messages are markup and escapes (written as text: json.dumps refuses 1e400)."""
    msg = json.dumps(f"{CLOSE} {QUIT_RUN} {ESCAPES} done")

    def ev(dt: float, kind: str, fields: str) -> str:
        return f'{{"v": 1, "cmd": "train", "t": {t0 + dt}, "kind": "{kind}", {fields}}}'

    return [   # a step's metric, then its progress (as the engine writes them)
        ev(1, "metric", '"step": 1, "values": {"loss": NaN, "acc_0": 1e400, "tau": -Infinity}'),
        ev(1.5, "progress", f'"done": 1, "total": 10, "unit": "step", "desc": {msg}, '
                            '"eta_s": 1e400, "rate": NaN'),
        ev(2, "metric", '"step": 2, "values": {"loss": 1.5, "acc_0": NaN, "tau": 2.0}'),
        ev(2.5, "progress", '"done": 2, "total": 10, "unit": "step", "eta_s": NaN'),
        ev(3, "log", f'"level": "warning", "msg": {msg}'),
        ev(4, "error", f'"type": "RuntimeError", "msg": {msg}'),
    ]


def write_hostile(tmp: Path, t0: float) -> Hostile:
    """ROOT/runs with an ended run named QUIT_RUN (NaN and 1e400 in its events, escapes in its
    output, `[/b]` as its code's manifest) and a running one named BAD_MARKUP_RUN; two
    checkpoint folders (CLOSE and CLICK_CKPT, real drafters); a log of hostile lines; a host
    python that fails with STDERR."""
    from tests.drafters import write_drafter  # torch: only where a test needs drafters

    root = tmp / "host"
    lines = events_lines(t0)
    ended = write_run(root, QUIT_RUN, lines, status="failed", start=t0, end=t0 + 5, exit_code=1,
                      train_json=False)
    running = write_run(root, BAD_MARKUP_RUN, lines[:2], status="running", start=t0 + 1,
                        train_json=False)
    for run_dir in (ended, running):
        rec = json.loads((run_dir / "run.json").read_text())
        rec["push"] = {"manifest": CLOSE, "git": {"engine": CLOSE + ESCAPES}}
        rec["profile"] = f"{CLOSE}{ESCAPES}"
        (run_dir / "run.json").write_text(json.dumps(rec))
        (run_dir / "output.log").write_text(f"{STDERR}\n{QUIT_RUN} {CLOSE}\n\x07\x7f\x9b2J\n")
    corrupt = root / "runs" / f"torn{OSC0}[a=b=c]"   # a record that is not JSON: `corrupt`
    corrupt.mkdir()
    (corrupt / "run.json").write_text("{" + ESCAPES)
    shelf = tmp / "shelf"
    write_drafter(shelf / "[" / "b]", seed=1)   # its path ends in `[/b]`
    write_drafter(shelf / CLICK_CKPT, seed=2)
    log = tmp / "vllm.log"
    log.write_text(f"INFO {CLOSE} {QUIT_RUN}\nERROR {ESCAPES} [red]x\n{STDERR}\n")
    python = tmp / "evil-python"
    python.write_text(f"#!/bin/sh\nprintf '%s\\n' {sh_quote(STDERR)} >&2\nexit 3\n")
    python.chmod(0o755)
    config = local_config(root, checkpoints=[str(shelf)], logs=[str(log)])
    config.hosts["evil"] = HostConfig(name="evil", python=str(python), root=str(tmp / "evil"))
    return Hostile(root, shelf, log, python, config)


def sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def screenshots(where: Path) -> list[Path]:
    """Any file a clicked screenshot action would have written."""
    return [Path(d) / n for d, _, files in os.walk(where) for n in files
            if n == SCREENSHOT]
