"""gpu_check's `stream-train` check: one node, a Mooncake master on 127.0.0.1, a producer and the
trainer sharing the GPU; the trainer's tokens/s streamed against training from the data directory.

On a demo workspace built on the spot, benchmarks/stream.py's measurement with the trainer on the
device (train's default: cuda when present): `engine stream-put` from the data directory as the
producer, against the same steps from the directory. Then, where `engine stream-capture` exists
and a vLLM is there ($VLLM_PYTHON, or this Python), the executor capture as the producer: vLLM on
the same GPU holding `--gpu-memory-utilization` CAPTURE_GPU_SHARE of it, the trainer beside it,
against the same from-disk figure. Skipped, with the reason, where Mooncake's store does not load
(the stream extra not installed there: `engine doctor` says which wheel and libraries).
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CAPTURE_GPU_SHARE = "0.4"
STEPS = {"gpu": 120, "cpu": 20}


def check_stream_train(cpu: bool) -> dict[str, Any]:
    from engine.stream.wheel import store_error
    why = store_error()
    if why is not None:
        return {"status": "skip", "reason": f"Mooncake's store does not load here ({why}); "
                                            "`python -m engine doctor` says what to install"}
    import torch
    if not cpu and not torch.cuda.is_available():
        return {"status": "fail", "reason": "no CUDA device"}
    import stream as bench  # benchmarks/stream.py (benchmarks/ is this script's sys.path[0])

    from engine.demo.workspace import init_demo
    from engine.events import Emitter
    from engine.stream.holder import default_segment_bytes
    from engine.stream.master import start_master
    steps = STEPS["cpu" if cpu else "gpu"]
    with tempfile.TemporaryDirectory(prefix="gpu-check-stream-") as tmp:
        work = Path(tmp)
        demo = work / "demo"
        init_demo(str(demo), Emitter("gpu_check", out=io.StringIO(), err=io.StringIO()))
        res = bench.measure(demo, work, steps, 1)
        disk = res["disk"]["tok_s"]
        out: dict[str, Any] = {
            "status": "ok", "device": "cpu" if cpu else torch.cuda.get_device_name(0),
            "steps": steps, "disk_tok_s": disk, "stream_tok_s": res["stream"]["tok_s"],
            "stream_ratio": res["ratio"], "stream_wait_s": res["stream"].get("wait_s")}
        py, why = _capture_python()
        if py is None:
            out["capture"] = f"skip: {why}"
            return out
        with start_master("127.0.0.1", log=work / "master-capture.log",
                      segment_bytes=default_segment_bytes()) as m:
            got = bench.streamed(demo, work / "capture", steps, str(m.address), "capture", [
                "stream-capture", "--target", str(demo / "target"), "--data",
                str(demo / "conversations" / "train.jsonl"), "--gpu-memory-utilization",
                CAPTURE_GPU_SHARE], python=py)
        out.update(capture_tok_s=got["tok_s"], capture_ratio=round(got["tok_s"] / disk, 3),
                   capture_wait_s=got.get("wait_s"))
        return out


def _capture_python() -> tuple[str | None, str]:
    """vLLM's Python for the capture producer, or why that half is skipped."""
    if not (ROOT / "engine" / "commands" / "stream_capture.py").is_file():
        return None, "no `engine stream-capture` in this engine"
    from gpu_check_mla_serve import vllm_python
    py = vllm_python()
    return (py, "") if py else (None, "no vLLM here (set VLLM_PYTHON)")
