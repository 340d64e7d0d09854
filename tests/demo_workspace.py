"""Session fixtures over ONE demo workspace (`python -m engine demo init`), built on first use.

Use from a test module with `pytest_plugins = ("tests.demo_workspace",)`. The workspace is built
by the real CLI in a subprocess; tests must treat it as read-only (copy what they change).
For development only, EAGLE3_DEMO_DIR=/path reuses (or builds once) a workspace across sessions.
"""

from __future__ import annotations

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
    d = Path(keep) if keep else tmp_path_factory.mktemp("demo") / "ws"
    if not (keep and (d / "demo.json").is_file()):
        run_engine("demo", "init", str(d), "--force", timeout=600)
    yield d


@pytest.fixture(scope="session")
def demo_info(demo_dir: Path) -> dict[str, Any]:
    return dict(json.loads((demo_dir / "demo.json").read_text(encoding="utf-8")))
