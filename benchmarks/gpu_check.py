"""Device check for a lent GPU machine: seven independent checks, one `CHECK` line each.

    bash benchmarks/gpu_check.sh                    # on the GPU machine, from anywhere
    bash benchmarks/gpu_check.sh --only bf16-train-step
    bash benchmarks/gpu_check.sh --cpu              # the same checks on CPU, tiny shapes

Measured on one H200 (2026-12-04): 112 s for the first four checks (mostly process start-up,
CUDA initialisation and random inputs built on the CPU); each check runs in its own process under
its own time limit (TIMEOUT_S), so the script ends however a check hangs. `--cpu`: 35-60 s.

Checks (each a fresh subprocess, so a crash or a poisoned CUDA context stays in its check):

ttt-attention
    The trainer's split TTT attention, forward and every gradient, against the dense masked
    reference in float64 on the same device (benchmarks/gpu_check_ttt.py says why: CUDA runs a
    kernel path no CPU test reaches).

bf16-train-step
    The trainer's own step (engine/training/train.py `Trainer.train_step`: target side, K-step TTT
    unroll of engine/model/draft.py, engine/model/ttt_loss.py, backward, grad clip, AdamW) at
    the llama3-8b preset's shape (H 4096, I 14336, 32/8 heads, target vocab 128256, draft vocab
    32000), T=2048, batch 1, K = the trainer's default (7), bf16 autocast on CUDA exactly as the
    trainer does it (fp32 master weights). The drafter and the batch are benchmarks/train.py's
    (`step_draft`, `step_inputs` at these sizes; 90% of target argmaxes in the draft vocab).
    3 warm-up steps, then the median of 10: tokens/s, peak memory, MFU = `step_flops` (analytic)
    / the GPU's dense bf16 datasheet peak (`PEAK_BF16`, by name; else n/a).
mla-capture-transformers
    `python -m engine prepare --device cuda` on a tiny random MLA target built on the spot
    (transformers' DeepseekV3ForCausalLM: q/kv LoRA ranks, 7 layers, MoE after the first dense
    one, 4 routed experts + 1 shared), with the demo's locally trained BPE tokenizer
    (engine/demo/target.py, no download) and demo chats in our JSONL shape. The output must open
    with engine.data.readers.open_data, and sample 0's captured final-norm hidden state (and its
    three aux states) must equal a direct transformers forward on the same device
    (`output_hidden_states`; the last entry taken after the final norm) within the stored
    dtype's tolerance. Every token uses all 4 experts, so a bf16 tie that flips a top-k routing
    choice cannot fail the comparison for no fault of the capture.
nvml-agent
    `python -m engine monitor --events --count 6 --interval 0.5` while this process keeps the
    GPU busy with bf16 matrix products; at least one GPU in the `sample` events must have util,
    mem_used/mem_total, power and temp filled. On CPU (or without NVML under --cpu): skip.
mla-serve-eagle3, mla-drafter-serve
    vLLM serving an MLA target with an EAGLE-3 drafter of ours (gpu_check_mla_serve.py), and the
    mla-capture target with an MLA drafter of ours (gpu_check_mla_drafter.py); skip without vLLM.
stream-train
    One node: a Mooncake master on 127.0.0.1, a producer and the trainer sharing the GPU
    (gpu_check_stream.py): tokens/s streamed (`stream-put` from a data directory; the executor
    capture `stream-capture` beside vLLM where both exist) against training from the directory,
    and the ratios; skip where Mooncake's store does not load.

Output: `CHECK name: ok|FAIL|skip ...` per check on stdout, a summary on stderr, with $OUT (or
--json PATH) $OUT/gpu_check.json and each check's log $OUT/gpu_check.NAME.log; exit 1 on a FAIL.

Device tool: `run(command="bash benchmarks/gpu_check.sh", timeout_s=540)` (the vLLM checks may
need a call each, `--only NAME`). Its python3 has torch, transformers, accelerate, nvidia-ml-py,
psutil; a carried .venv/lib/python3.11/site-packages/pynvml.py is put on the path if needed.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from gpu_check_mla_drafter import check_mla_drafter_serve
from gpu_check_mla_serve import check_mla_serve
from gpu_check_mla_target import build_mla_target
from gpu_check_stream import check_stream_train
from gpu_check_ttt import check_ttt_attention

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
TIMEOUT_S = {"ttt-attention": 120, "bf16-train-step": 200, "mla-capture-transformers": 200,
             "nvml-agent": 60, "mla-serve-eagle3": 560, "mla-drafter-serve": 300,
             "stream-train": 420}
CHECKS = tuple(TIMEOUT_S)

# Dense (no sparsity) bf16 tensor-core peaks from the vendors' datasheets, FLOP/s, matched as
# substrings of torch.cuda.get_device_name() in this order (the first match wins).
PEAK_BF16: tuple[tuple[str, float], ...] = (
    ("GH200", 989.4e12), ("H200", 989.4e12), ("H100 PCIe", 756.0e12), ("H100 NVL", 835.0e12),
    ("H100", 989.4e12), ("H800", 989.4e12), ("H20", 148.0e12), ("B200", 2250e12),
    ("A100", 312.0e12), ("A800", 312.0e12), ("L40S", 362.1e12), ("L40", 181.0e12),
    ("L4", 121.0e12),
)


def peak_bf16(name: str) -> float | None:
    for key, flops in PEAK_BF16:
        if key in name:
            return flops
    return None


def _quiet() -> Any:
    from engine.events import Emitter
    return Emitter("gpu_check", out=io.StringIO(), err=io.StringIO())


def _env(cpu: bool) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + (
        os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
        TOKENIZERS_PARALLELISM="false")
    if cpu:
        env.update(OMP_NUM_THREADS="2", CUDA_VISIBLE_DEVICES="")
    return env


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


# -- 1. bf16-train-step ---------------------------------------------------------------------------

def step_flops(h: int, i: int, nh: int, nkv: int, hd: int, vd: int, t: int, k: int,
               rows: list[int]) -> float:
    """Model FLOPs of one training step (forward + backward, no recompute), an ESTIMATE counting
    matmuls only (norms, RoPE, softmax, the loss and AdamW are left out). Batch 1, T tokens,
    target hidden Ht = H, rows[i] = positions whose logits step i computes (step_rows).

      fc          4 * T * 3H * H             once (aux needs no gradient: forward + weight grad)
      embed half  6 * T * H * (nh+2nkv)*hd   once (the tokens' part of q/k/v, shared by K steps)
      per step    6 * T * (H*(nh+2nkv)*hd + nh*hd*H + 3*H*I)   x K  (hidden half of q/k/v,
                  o_proj, MLP: the usual 6 x params x tokens)
      attention   12 * nh * hd * T * (T/2 + i)   step i: QK^T and PV over the causal step-0
                  keys (half the square: what a causal kernel computes) + i diagonal keys, x3
      lm_head     6 * rows[i] * H * Vd       step i, on the supervised in-vocab rows only
      target      2 * T * H * Vd             target logits over the draft vocab (no gradient)
    """
    qkv = (nh + 2 * nkv) * hd
    flops = 4.0 * t * 3 * h * h + 6.0 * t * h * qkv
    flops += k * 6.0 * t * (h * qkv + nh * hd * h + 3 * h * i)
    flops += sum(12.0 * nh * hd * t * (t / 2 + s) for s in range(k))
    flops += sum(6.0 * r * h * vd for r in rows)
    flops += 2.0 * t * h * vd
    return flops


class _OneBatch:
    """The trainer's data source, holding one batch (CPU tensors, as shards are read)."""

    def __init__(self, batch: dict[str, Any]) -> None:
        self.b = batch
        self.lengths = [int(batch["input_ids"].shape[1])]
        self.loss_counts = [int(batch["loss_mask"][0, 2:].sum())]

    def batch(self, idx: tuple[int, ...]) -> dict[str, Any]:
        return self.b


def check_bf16_train_step(cpu: bool) -> dict[str, Any]:
    import torch

    if not cpu and not torch.cuda.is_available():
        return {"status": "fail", "reason": f"no CUDA device (torch {torch.__version__}, "
                                            f"CUDA {torch.version.cuda})"}
    dev = torch.device("cpu" if cpu else "cuda")
    t0 = time.perf_counter()
    built = _step_inputs(cpu)
    if "status" in built:
        return built
    setup_s = time.perf_counter() - t0
    tr = _trainer(built, dev)
    base_kb = _rss_kb()
    if not cpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    from engine.training.plan import Step
    step = Step(epoch=0, index=0, micro=((0,),))
    metrics = []
    for _ in range(built["warm"] + built["timed"]):
        metrics.append(tr.train_step(step))
        tr.step += 1
    last = metrics[-1]
    if not (math.isfinite(last["loss"]) and math.isfinite(last["grad_norm"])):
        return {"status": "fail", "reason": f"loss {last['loss']} grad_norm {last['grad_norm']}"}
    out = _step_report(built, metrics, dev, cpu, bool(tr.amp), setup_s)
    if cpu:
        import resource
        out["peak_rss_mb"] = round(
            (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_kb) / 1024)
    else:
        out["peak_mem_gb"] = round(torch.cuda.max_memory_allocated(dev) / 1e9, 2)
    return out


def _step_inputs(cpu: bool) -> dict[str, Any]:
    """The drafter and one batch at the check's shape (benchmarks/train.py builds both), or a
    failure when the drafter is not the llama3-8b preset's shape."""
    import torch

    sys.path.insert(0, str(BENCH))
    import train as bench  # benchmarks/train.py: step_draft, step_inputs, STEP_SHAPE

    from engine.model.presets import preset
    from engine.model.ttt_loss import step_rows
    from engine.training.config import TrainConfig

    k = TrainConfig.__dataclass_fields__["ttt_steps"].default  # the trainer's default K
    if cpu:
        h, t, v, vd, nh, nkv, warm, timed = 128, 128, 4096, 1024, 4, 2, 1, 3
    else:
        ref = preset("llama3-8b")
        h, t, v, vd = ref.hidden_size, 2048, ref.vocab_size, ref.draft_vocab_size
        nh, nkv, warm, timed = ref.num_attention_heads, ref.num_key_value_heads, 3, 10
        torch.set_num_threads(min(16, os.cpu_count() or 1))  # the CPU-side input building
    bench.STEP_SHAPE.update(t=t, v=v, vd=vd, heads=nh, kv_heads=nkv)
    spec = {"impl": "new", "hidden": h, "k": k, "coverage": 0.9}
    draft = bench.step_draft(spec)  # fp32 on the CPU, as the trainer builds it
    inputs = bench.step_inputs(spec, draft)
    cfg_d = draft.config
    if not cpu:  # the shape claimed in the docstring
        ref = preset("llama3-8b")
        for f in ("hidden_size", "intermediate_size", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "vocab_size", "draft_vocab_size"):
            if getattr(cfg_d, f) != getattr(ref, f):
                return {"status": "fail", "reason": f"drafter {f} {getattr(cfg_d, f)} != "
                                                    f"llama3-8b preset's {getattr(ref, f)}"}
    stored = torch.float32 if cpu else torch.bfloat16  # what prepare stores on that device
    batch = {"input_ids": inputs["ids"], "attention_mask": inputs["att"],
             "loss_mask": inputs["loss_mask"], "aux": inputs["aux"].to(stored),
             "hidden": inputs["hidden"].to(stored), "target_argmax": inputs["stored_top"]}
    in_vocab = draft.t2d[inputs["stored_top"]]
    rows = [int(r.numel()) for r in step_rows(inputs["loss_mask"], in_vocab, k)]
    return {"draft": draft, "head_d": inputs["head_d"], "batch": batch, "rows": rows, "k": k,
            "h": h, "t": t, "v": v, "vd": vd, "nh": nh, "nkv": nkv, "warm": warm,
            "timed": timed}


def _trainer(built: dict[str, Any], dev: Any) -> Any:
    """The trainer's own step on an in-memory one-batch data source: what Trainer.setup() does
    after building (engine/training/train.py), one process."""
    import torch
    from torch.optim.lr_scheduler import LambdaLR

    from engine.dist import Dist
    from engine.training.config import TrainConfig
    from engine.training.train import Trainer, Unroll, lr_factor

    k, steps = built["k"], built["warm"] + built["timed"]
    work = tempfile.mkdtemp(prefix="gpu-check-train-")
    cfg = TrainConfig(target=work, data=work, out=work, ttt_steps=k, precision="bf16",
                      max_steps=steps)
    tr = Trainer(cfg, Dist(device=dev), _quiet(), [])  # tr.amp: bf16 autocast on CUDA only
    tr.setup_ = type("S", (), {"data": _OneBatch(built["batch"])})()  # type: ignore[assignment]
    tr.draft = built["draft"].to(dev)
    tr.head_d = built["head_d"].to(dev)
    tr.lm_head = None
    tr.module = Unroll(tr.draft, k)
    tr.opt = torch.optim.AdamW([p for p in tr.module.parameters() if p.requires_grad],
                               lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    tr.total, tr.warmup, tr.step = steps, 0, 0
    tr.sched = LambdaLR(tr.opt, lambda s: lr_factor(s, tr.total, tr.warmup))
    return tr


def _step_report(built: dict[str, Any], metrics: list[dict[str, Any]], dev: Any, cpu: bool,
                 amp: bool, setup_s: float) -> dict[str, Any]:
    import torch

    warm, timed, k, t, rows = built["warm"], built["timed"], built["k"], built["t"], built["rows"]
    cfg_d = built["draft"].config
    times = [m["step_time_s"] for m in metrics[warm:]]
    med = statistics.median(times)
    flops = step_flops(built["h"], cfg_d.intermediate_size, built["nh"], built["nkv"],
                       cfg_d.head_dim, built["vd"], t, k, rows)
    name = "cpu" if cpu else torch.cuda.get_device_name(dev)
    peak = None if cpu else peak_bf16(name)
    share = {phase: round(statistics.median(m.get(f"t_{phase}_s", 0.0)
                                            for m in metrics[warm:]) / med, 3)
             for phase in ("data", "target", "draft", "backward", "optimizer")}
    last = metrics[-1]
    return {
        "status": "ok", "device": name, "precision": "bf16-autocast" if amp else "fp32",
        "hidden": built["h"], "t": t, "k": k, "vocab": built["v"], "draft_vocab": built["vd"],
        "tokens_per_s": round(t / med, 1), "step_ms": round(1000 * med, 2),
        "step_ms_min": round(1000 * min(times), 2), "steps_timed": timed, "warmup": warm,
        "lm_head_rows_per_step": round(sum(rows) / (k * t), 3),
        "tflop_per_step_est": round(flops / 1e12, 3),
        "achieved_tflops": round(flops / med / 1e12, 2),
        "mfu": "n/a" if peak is None else f"{100 * flops / med / peak:.1f}%",
        "peak_bf16_tflops": None if peak is None else round(peak / 1e12, 1),
        "loss": round(last["loss"], 4), "share": share, "setup_s": round(setup_s, 1),
        "torch": torch.__version__, "cuda": torch.version.cuda,
    }


def _rss_kb() -> int:
    sys.path.insert(0, str(BENCH))
    from step_timing import rss_kb
    return rss_kb()


# -- 2. mla-capture-transformers ------------------------------------------------------------------

def _from_pretrained(cls: Any, path: str, dtype: Any) -> Any:
    try:
        return cls.from_pretrained(path, dtype=dtype)
    except TypeError:  # transformers 4.x spelling
        return cls.from_pretrained(path, torch_dtype=dtype)


def check_mla_capture(cpu: bool) -> dict[str, Any]:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from engine.data.conversations import write_conversations
    from engine.data.readers import open_data

    hf_logging.disable_progress_bar()
    if not cpu and not torch.cuda.is_available():
        return {"status": "fail", "reason": "no CUDA device"}
    device = "cpu" if cpu else "cuda"
    work = Path(tempfile.mkdtemp(prefix="gpu-check-mla-"))
    tdir, conv, data_dir = work / "target", work / "conv.jsonl", work / "data"
    convs = build_mla_target(str(tdir), 48 if cpu else 256)
    write_conversations(str(conv), convs)
    cmd = [sys.executable, "-m", "engine", "prepare", "--events", "--target", str(tdir),
           "--data", str(conv), "--out", str(data_dir), "--device", device]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=_env(cpu), cwd=ROOT,
                       timeout=150)
    wall = time.perf_counter() - t0
    events = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    result = next((e["data"] for e in events if e.get("kind") == "result"), None)
    if p.returncode != 0 or result is None:
        err = next((e["msg"] for e in events if e.get("kind") == "error"), None)
        return {"status": "fail", "reason": f"prepare exit {p.returncode}: "
                                            f"{err or _last_line(p.stderr) or 'no result event'}"}
    data = open_data(str(data_dir))
    s = data[0]
    ids = s.input_ids[None].to(device)
    model = _from_pretrained(AutoModelForCausalLM, str(tdir), s.hidden.dtype).to(device).eval()
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        hs = out.hidden_states  # (embeddings, ..., last): entry k is the input of layer k
        last = hs[-1]
        # transformers 5 returns the final-norm state as the last entry; older code paths (and
        # any version that stops doing so) the last layer's raw output: tell them apart by the
        # logits, which are always lm_head(final-norm state).
        post_norm = torch.allclose(model.lm_head(last).float(), out.logits.float(),
                                   rtol=1e-3, atol=1e-3)
        ref = last if post_norm else model.model.norm(last)
        ref = ref[0].float().cpu()
        aux_ref = torch.cat([hs[j][0] for j in data.aux_layer_ids], dim=-1).float().cpu()
    got, aux_got = s.hidden.float(), s.aux.float()
    diff = (got - ref).abs().max().item()
    rel = diff / max(ref.abs().max().item(), 1e-12)
    aux_rel = (aux_got - aux_ref).abs().max().item() / max(aux_ref.abs().max().item(), 1e-12)
    tol = 1e-4 if s.hidden.dtype == torch.float32 else 5e-2  # bf16: CPU probe saw 6e-3
    res: dict[str, Any] = {
        "status": "ok", "device": device if cpu else torch.cuda.get_device_name(0),
        "transformers": transformers.__version__, "samples": len(data),
        "tokens": result["tokens"], "dtype": result["dtype"],
        "tokens_per_s": round(result["tokens"] / max(result["seconds"], 1e-9)),
        "prepare_wall_s": round(wall, 1), "sample0_tokens": int(ids.shape[1]),
        "max_abs_diff": float(f"{diff:.3g}"), "rel_diff": float(f"{rel:.3g}"),
        "aux_rel_diff": float(f"{aux_rel:.3g}"), "tol": tol,
        "aux_layer_ids": data.aux_layer_ids, "hs_last_post_norm": post_norm,
    }
    if tuple(got.shape) != tuple(ref.shape) or not rel <= tol or not aux_rel <= tol:
        res["status"] = "fail"
        res["reason"] = (f"captured != direct forward: hidden rel diff {rel:.3g}, aux rel diff "
                         f"{aux_rel:.3g} (tol {tol}), shapes {list(got.shape)} "
                         f"{list(ref.shape)}")
    return res


# -- 3. nvml-agent --------------------------------------------------------------------------------

NEEDED = ("util", "mem_used", "mem_total", "power", "temp")


def check_nvml_agent(cpu: bool) -> dict[str, Any]:
    load = None if cpu else _GpuLoad()  # CUDA up before the monitor starts: its samples see it
    cmd = [sys.executable, "-m", "engine", "monitor", "--events", "--count", "6",
           "--interval", "0.5", "--path", str(ROOT)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(cpu), cwd=ROOT)
    busy = load.run_while(proc) if load is not None else None
    try:
        stdout, stderr = proc.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        proc.kill()
        return {"status": "fail", "reason": "monitor gave no 6 samples within 40 s"}
    samples = [e for e in (json.loads(ln) for ln in stdout.splitlines() if ln.startswith("{"))
               if e.get("kind") == "sample"]
    if proc.returncode != 0 or not samples:
        return {"status": "fail", "reason": f"monitor exit {proc.returncode}, {len(samples)} "
                                            f"samples: {_last_line(stderr)}"}
    gpus = [g for e in samples for g in e.get("gpus") or []]
    if not gpus:
        reason = samples[-1].get("reason") or "no GPU in the samples"
        if cpu:
            return {"status": "skip", "reason": f"no GPU ({reason})", "samples": len(samples),
                    "host_filled": samples[-1].get("host") is not None}
        return {"status": "fail", "reason": reason}
    full = [g for g in gpus if all(g.get(f) is not None for f in NEEDED) and not g.get("error")]
    last = samples[-1]["gpus"][0]
    out: dict[str, Any] = {
        "samples": len(samples), "gpus": len(samples[-1]["gpus"]), "name": last.get("name"),
        "driver": samples[-1].get("driver"),
        "mem_total_gib": None if last.get("mem_total") is None else
        round(last["mem_total"] / 2**30, 1),
        "util": last.get("util"), "util_max": max((g.get("util") or 0) for g in gpus),
        "mem_used_gib": None if last.get("mem_used") is None else
        round(last["mem_used"] / 2**30, 2),
        "power_w": last.get("power"), "power_max_w": max((g.get("power") or 0) for g in gpus),
        "temp_c": last.get("temp"), "sm_clock": last.get("sm_clock"),
        "procs_max": max(len(g.get("procs") or []) for g in gpus), "load_tflops": busy,
        "host_filled": samples[-1].get("host") is not None, "gpu_sample": last,
    }
    if not full:
        missing = [f for f in NEEDED if last.get(f) is None]
        out.update(status="fail", reason=f"no GPU sample with {', '.join(NEEDED)} all "
                                         f"filled (missing {', '.join(missing)}; error "
                                         f"{last.get('error')})")
    else:
        out["status"] = "ok"
    return out


class _GpuLoad:
    """bf16 8192^3 matrix products while the monitor samples, so that its utilisation and power
    readings have something to see. Never the check's result: any failure here only leaves the
    GPU idle (`run_while` then returns None)."""

    def __init__(self) -> None:
        self.a: Any = None
        try:
            import torch
            if torch.cuda.is_available():
                self.a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
                (self.a @ self.a).sum().item()  # CUDA context, cuBLAS handle, first kernel
        except Exception:
            self.a = None

    def run_while(self, proc: subprocess.Popen) -> float | None:
        """Matrix products until `proc` ends (at most 30 s); their TFLOP/s."""
        if self.a is None:
            return None
        try:
            import torch
            n, t0 = 0, time.perf_counter()
            while proc.poll() is None and time.perf_counter() - t0 < 30:
                for _ in range(20):
                    self.a @ self.a
                torch.cuda.synchronize()
                n += 20
            dt = time.perf_counter() - t0
            return round(n * 2 * 8192**3 / dt / 1e12, 1) if n else None
        except Exception:
            return None


# -- driver ---------------------------------------------------------------------------------------

WORKERS = {"ttt-attention": check_ttt_attention, "bf16-train-step": check_bf16_train_step,
           "mla-capture-transformers": check_mla_capture, "nvml-agent": check_nvml_agent,
           "mla-serve-eagle3": lambda cpu: check_mla_serve(cpu, _env(cpu), build_mla_target),
           "mla-drafter-serve": check_mla_drafter_serve, "stream-train": check_stream_train}
SHOWN = {  # CHECK line fields per check, in order (the JSON summary has everything)
    "ttt-attention": ("device", "cases", "worst_rel"),
    "bf16-train-step": ("device", "precision", "tokens_per_s", "step_ms", "peak_mem_gb",
                        "peak_rss_mb", "mfu", "achieved_tflops", "tflop_per_step_est"),
    "mla-capture-transformers": ("device", "dtype", "samples", "tokens", "tokens_per_s",
                                 "max_abs_diff", "rel_diff", "aux_rel_diff", "tol"),
    "nvml-agent": ("name", "driver", "mem_total_gib", "util", "util_max", "mem_used_gib",
                   "power_w", "power_max_w", "temp_c", "sm_clock", "procs_max", "samples"),
    "mla-serve-eagle3": ("device", "acceptance_length", "drafts", "samples", "vllm_wall_s"),
    "mla-drafter-serve": ("startup_s", "completion_tokens", "drafts", "accepted",
                          "acceptance_length"),
    "stream-train": ("device", "steps", "disk_tok_s", "stream_tok_s", "stream_ratio",
                     "stream_wait_s", "capture_tok_s", "capture_ratio", "capture"),
}


def worker(name: str, cpu: bool) -> int:
    try:
        res = WORKERS[name](cpu)
    except Exception as e:
        traceback.print_exc()
        first = (str(e).splitlines() or [""])[0][:240]
        res = {"status": "fail", "reason": f"{type(e).__name__}: {first}"}
    print("RESULT " + json.dumps(res, default=str), flush=True)
    return 0


def run_check(name: str, cpu: bool, log_dir: Path | None) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name]
    if cpu:
        cmd.append("--cpu")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(cpu), cwd=ROOT, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S[name])
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the worker and whatever it started
        stdout, stderr = proc.communicate()
        timed_out = True
    secs = round(time.perf_counter() - t0, 1)
    if log_dir is not None:
        (log_dir / f"gpu_check.{name}.log").write_text(
            f"$ {' '.join(cmd)}\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n", encoding="utf-8")
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith("RESULT ")), None)
    if timed_out:
        res = {"status": "fail", "reason": f"timed out after {TIMEOUT_S[name]} s"}
    elif line is None:
        res = {"status": "fail", "reason": f"worker exit {proc.returncode}: "
                                           f"{_last_line(stderr) or 'no result'}"}
    else:
        res = json.loads(line[len("RESULT "):])
    res["seconds"] = secs
    return res


def check_line(name: str, res: dict[str, Any]) -> str:
    status = res.get("status", "fail")
    if status == "fail":
        return f"CHECK {name}: FAIL {res.get('reason', '?')}"
    if status == "skip":
        return f"CHECK {name}: skip {res.get('reason', '')}"
    fields = [f"{k}={res[k]}".replace(" ", "_") for k in SHOWN[name] if res.get(k) is not None]
    return f"CHECK {name}: ok " + " ".join(fields + [f"seconds={res['seconds']}"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", action="append", choices=CHECKS, metavar="NAME",
                    help=f"run only this check (repeatable): {', '.join(CHECKS)}")
    ap.add_argument("--cpu", action="store_true", help="run the checks on CPU, tiny shapes")
    ap.add_argument("--json", metavar="PATH", help="summary file (default: $OUT/gpu_check.json)")
    ap.add_argument("--worker", choices=CHECKS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.cpu)
    out_env = os.environ.get("OUT")
    log_dir = Path(out_env) if out_env else None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    summary_path = Path(args.json) if args.json else (
        log_dir / "gpu_check.json" if log_dir else None)
    t0 = time.perf_counter()
    results: dict[str, Any] = {}
    for name in args.only or CHECKS:
        res = run_check(name, args.cpu, log_dir)
        results[name] = res
        print(check_line(name, res), flush=True)
    failed = [n for n, r in results.items() if r.get("status") == "fail"]
    total = round(time.perf_counter() - t0, 1)
    print(f"gpu_check: {len(results) - len(failed)}/{len(results)} not failed in {total} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""), file=sys.stderr)
    if summary_path is not None:
        summary = {"cpu_mode": args.cpu, "python": sys.version.split()[0],
                   "seconds": total, "ok": not failed, "checks": results}
        summary_path.write_text(json.dumps(summary, indent=2, default=str) + "\n",
                                encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
