"""Benchmark: swapping a drafter into a running vLLM vs restarting vLLM with it, in one run.

    python benchmarks/swap.py --target T --drafter A --swap-in B [--rounds 3] [--json]

Needs a real vLLM (`make setup-vllm`, or EAGLE3_VLLM_PYTHON). A and B are vLLM-loadable drafter
exports of the same shapes (e.g. two checkpoints of one finetune, `engine convert --to vllm`).
The server is started as `serve` starts it (console/checkpoints/serve.py: loopback, dev mode,
our drafter backend), with A. Then:
  swap     vLLM's route sequence (start_draft_weight_update, update_weights with B's folder,
           finish_weight_update with a version) until /weight_info reads the new version back;
           A and B alternately, `--rounds` times each way (what `eagle3-console swap` adds on
           top, the inspect on the host, is excluded: it does not grow with the target)
  restart  the server stopped (SIGTERM to its session) and started again with B, until it
           answers /v1/models: what trying B cost before
Target: median swap <= 0.05x the restart.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def start(py: str, target: str, drafter: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    from console.checkpoints.serve import ServeRequest, vllm_argv, vllm_env
    from tests.vllm_real import vllm_env as test_env
    req = ServeRequest(ckpt=drafter, verifier=target, k=3, port=port,
                       extra=["--max-model-len", "512", "--enforce-eager"])
    argv = vllm_argv(req)
    argv[0] = str(Path(py).parent / "vllm")
    with open(log, "ab") as out:
        return subprocess.Popen(argv, env={**test_env(), **vllm_env(req)}, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(proc: subprocess.Popen[bytes], port: int, log: Path, limit: float = 900) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if proc.poll() is not None:
            sys.exit(f"vLLM exited {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"vLLM not ready in {limit:.0f} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # its own session: vLLM and its engine core
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def post(port: int, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=600).read())


def swap(port: int, drafter: str, version: str) -> float:
    t0 = time.perf_counter()
    post(port, "/start_draft_weight_update", {})
    post(port, "/update_weights", {"update_info": {"path": drafter}})
    post(port, "/finish_weight_update", {"weight_version": version})
    info = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/weight_info",
                                             timeout=60).read())
    took = time.perf_counter() - t0
    if info.get("weight_version") != version:
        sys.exit(f"/weight_info says {info}, not {version!r}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True, help="served first (vLLM export)")
    ap.add_argument("--swap-in", required=True, help="swapped in, and restarted with")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from tests.sshd import free_port
    from tests.vllm_real import find_vllm_python
    py = find_vllm_python()
    if py is None:
        sys.exit("no vLLM here: make setup-vllm (or set EAGLE3_VLLM_PYTHON)")
    a, b = str(Path(args.drafter).resolve()), str(Path(args.swap_in).resolve())
    log = Path(tempfile.mkdtemp(prefix="swap-bench-")) / "vllm.log"
    port = free_port()
    t0 = time.monotonic()
    proc = start(py, args.target, a, port, log)
    try:
        wait_ready(proc, port, log)
        first_start = time.monotonic() - t0
        swaps = []
        for r in range(args.rounds):
            swaps.append(swap(port, b, f"B-{r}"))
            swaps.append(swap(port, a, f"A-{r}"))
        t1 = time.monotonic()
        stop(proc)
        port = free_port()
        proc = start(py, args.target, b, port, log)
        wait_ready(proc, port, log)
        restart = time.monotonic() - t1
    finally:
        stop(proc)
    med = statistics.median(swaps)
    out = {"first_start_s": round(first_start, 2), "restart_s": round(restart, 2),
           "swap_s": [round(s, 4) for s in swaps], "swap_median_s": round(med, 4),
           "ratio": round(med / restart, 5), "target": 0.05, "met": med / restart <= 0.05}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"first start {first_start:.1f} s; restart with the new drafter until it answers "
          f"{restart:.1f} s")
    print(f"swap (routes until /weight_info reads it back): median {med:.3f} s of "
          f"{len(swaps)} ({min(swaps):.3f}-{max(swaps):.3f})")
    print(f"swap / restart = {med / restart:.4f} (target <= 0.05: "
          f"{'met' if out['met'] else 'not met'})")


if __name__ == "__main__":
    main()
