"""`python -m engine prepare`: conversations -> target features in safetensors shards.

    python -m engine prepare --target T --data conv.jsonl --out DATA [--device-map auto]
    torchrun --nproc-per-node 8 -m engine prepare --target T --data conv.jsonl --out DATA
    python -m engine prepare --target T --data conv.jsonl --out DATA --vllm-engine --tp 8
    python -m engine prepare --target T --data conv.jsonl --out DATA --from-vllm URL
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from engine.events import Emitter

HELP = "apply the chat template, mask assistant tokens, capture target features into shards"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="target model directory")
    p.add_argument("--data", required=True, help="conversations JSONL (ours or ShareGPT)")
    p.add_argument("--out", required=True, help="data directory to create")
    p.add_argument("--max-len", type=int, default=2048, help="token limit per conversation")
    p.add_argument("--batch-tokens", type=int, default=16384,
                   help="padded tokens per target forward (default 16384)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="stored dtype (default: float32 on CPU, the target's dtype on GPU)")
    p.add_argument("--shard-mb", type=float, default=1024, help="approximate shard size")
    p.add_argument("--fp8", action="store_true",
                   help="store the aux and final states as float8_e4m3fn with a per-token scale "
                        "(half of bf16 on disk; readers dequantise)")
    p.add_argument("--device", help="torch device (default: cuda:LOCAL_RANK if present, else cpu)")
    p.add_argument("--device-map", choices=("auto",),
                   help="auto: spread a target too big for one GPU over all visible GPUs "
                        "(under torchrun: over this rank's share of them); on CPU: no-op")
    p.add_argument("--keep-free-gb", type=float, default=0.0,
                   help="refuse unless this much disk stays free after the estimated output")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    v = p.add_argument_group("capture through a vLLM server (engine/capture/vllm_capture.py)")
    v.add_argument("--from-vllm", metavar="URL",
                   help="features from this vLLM server (started by `engine capture-server`) "
                   "instead of loading the target here")
    v.add_argument("--model", help="served model name (default: the server's first)")
    v.add_argument("--concurrency", type=int, default=16, help="requests in flight (default 16)")
    v.add_argument("--server-storage", metavar="DIR",
                   help="the server's storage directory (capture-server --storage; default "
                   "its default): server files are read and deleted only inside it")
    v.add_argument("--keep-server-files", action="store_true",
                   help="keep the server's hidden-state files once a shard holds them")
    v.add_argument("--max-failures", type=int, default=10,
                   help="failed requests in a row before giving up (default 10)")
    e = p.add_argument_group("capture through vLLM's executor in this process "
                             "(engine/capture/vllm_engine.py; any model vLLM runs, MLA included)")
    e.add_argument("--vllm-engine", action="store_true",
                   help="start vLLM here with the target and capture through its workers")
    add_engine_options(e)


def add_engine_options(e: Any) -> None:
    """The executor capture's vLLM flags (prepare --vllm-engine, stream-capture)."""
    e.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs (default 1)")
    e.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="the GPUs' share vLLM takes (default 0.9)")
    e.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="another vLLM engine argument (VALUE as JSON if it parses), e.g. "
                        "quantization=fp8 or max_model_len=8192; repeatable")
    e.add_argument("--check-every", type=int, default=16, metavar="N",
                   help="self-check the first sample of every Nth batch against vLLM's own "
                        "log-probs (0: never; default 16)")
    e.add_argument("--reference-check", choices=("auto", "full", "layers", "off"),
                   default="auto",
                   help="also compare the checked samples' states with a transformers forward "
                        "of the text stack: whole (full) or one layer at a time (layers); "
                        "auto: full when it fits this host's memory, else layers, else off")


def run(args: argparse.Namespace, ev: Emitter) -> int:
    if args.from_vllm and args.vllm_engine:
        from engine.errors import UsageError
        raise UsageError("--from-vllm and --vllm-engine: pick one (a server elsewhere, or an "
                         "engine in this process)")
    if args.from_vllm:
        return _run_from_vllm(args, ev)
    if args.vllm_engine:
        return _run_vllm_engine(args, ev)
    from engine.data.prepare import prepare
    manifest = prepare(args.target, args.data, args.out, max_len=args.max_len,
                       batch_tokens=args.batch_tokens, dtype=args.dtype, shard_mb=args.shard_mb,
                       device=args.device, ev=ev, overwrite=args.overwrite,
                       device_map=args.device_map, keep_free_gb=args.keep_free_gb,
                       fp8=args.fp8)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0  # under torchrun, rank 0 alone reports
    ev.answer(manifest, args.json, lambda m: (
        f"{m['samples']} samples, {m['tokens']} tokens ({m['loss_tokens']} assistant) in "
        f"{len(m['shards'])} shard(s) at {args.out}; skipped {m['skipped']}"))
    return 0


def _run_from_vllm(args: argparse.Namespace, ev: Emitter) -> int:
    from engine.capture.vllm_capture import prepare_from_vllm
    manifest = prepare_from_vllm(
        args.target, args.data, args.out, args.from_vllm, model=args.model,
        concurrency=args.concurrency, max_len=args.max_len, dtype=args.dtype,
        shard_mb=args.shard_mb, keep_server_files=args.keep_server_files,
        max_failures=args.max_failures, ev=ev, overwrite=args.overwrite,
        batch_tokens=args.batch_tokens, keep_free_gb=getattr(args, "keep_free_gb", 0.0),
        server_storage=args.server_storage, fp8=args.fp8)
    ev.answer(manifest, args.json, lambda m: (
        f"{m['samples']} samples, {m['tokens']} tokens ({m['loss_tokens']} assistant) in "
        f"{len(m['shards'])} shard(s) at {args.out} from {args.from_vllm}; "
        f"skipped {m['skipped']}"))
    return 0


def _run_vllm_engine(args: argparse.Namespace, ev: Emitter) -> int:
    from engine.capture.vllm_engine import keep_stdout_for, parse_engine_args, prepare_from_engine
    keep_stdout_for(ev)
    manifest = prepare_from_engine(
        args.target, args.data, args.out, tp=args.tp,
        gpu_memory_utilization=args.gpu_memory_utilization, max_len=args.max_len,
        dtype=args.dtype, shard_mb=args.shard_mb, batch_tokens=args.batch_tokens,
        engine_args=parse_engine_args(args.engine_arg), check_every=args.check_every, ev=ev,
        overwrite=args.overwrite, keep_free_gb=args.keep_free_gb,
        reference=args.reference_check, fp8=args.fp8)
    ev.answer(manifest, args.json, lambda m: (
        f"{m['samples']} samples, {m['tokens']} tokens ({m['loss_tokens']} assistant) in "
        f"{len(m['shards'])} shard(s) at {args.out} through vLLM's executor "
        f"({m['capture']['tokens_per_s']} tokens/s); skipped {m['skipped']}"))
    return 0
