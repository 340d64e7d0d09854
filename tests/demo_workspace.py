"""Session fixtures over ONE demo workspace (`python -m engine demo init`), built on first use.

Use from a test module with `pytest_plugins = ("tests.demo_workspace",)`. The workspace is built
by the real CLI in a subprocess; tests must treat it as read-only (copy what they change).
For development only, EAGLE3_DEMO_DIR=/path reuses (or builds once) a workspace across sessions.
Under pytest-xdist (`make test` runs two workers) the workers share one workspace: the first to
ask builds it under the run's common temp root while holding a lock; the others wait on the lock
and reuse it, so the minute-long build happens once per run, not once per worker.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.engine_helpers import run_engine


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The demo workspace: target/, data/, eval/, public-drafter/, conversations/, demo.json."""
    keep = os.environ.get("EAGLE3_DEMO_DIR")
    if keep:
        d = Path(keep)
    elif os.environ.get("PYTEST_XDIST_WORKER"):
        d = tmp_path_factory.getbasetemp().parent / "demo-ws"  # common to this run's workers
    else:
        d = tmp_path_factory.mktemp("demo") / "ws"
    d.parent.mkdir(parents=True, exist_ok=True)
    with open(d.parent / f"{d.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder; the others wait here, then reuse
        if not (d / "demo.json").is_file():  # written last by a finished build
            run_engine("demo", "init", str(d), "--force", timeout=600)
        elif not (d / "logs" / "vllm-serve.log").is_file():  # a kept one from an older engine
            run_engine("demo", "update", str(d))
    yield d


@pytest.fixture(scope="session")
def demo_info(demo_dir: Path) -> dict[str, Any]:
    return dict(json.loads((demo_dir / "demo.json").read_text(encoding="utf-8")))
