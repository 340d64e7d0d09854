"""`python -m engine stream-capture`: the executor capture as a stream run's producer.

    python -m engine stream-capture --target T --data conv.jsonl --to HOST:RPC/META --run NAME \
        [--tp 8 --gpu-memory-utilization 0.85 --batch-tokens 16384 --high-samples N ...]

vLLM starts in this process with our worker extension (as `prepare --vllm-engine`); the run's
manifest is put before its first forward, the trainer's plan (`train --from-stream ADDR --data
NAME`) is awaited, and each sample's features (aux states, final state normed) are put in the
plan's order within the pool's watermarks (engine/capture/vllm_stream.py). No file is written.
"""

from __future__ import annotations

import argparse

from engine.commands.prepare import add_engine_options
from engine.commands.stream_put import add_pool_options
from engine.events import Emitter

HELP = "capture features through vLLM's executor straight into a store for `train --from-stream`"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="target model directory")
    p.add_argument("--data", required=True, help="conversations JSONL (ours or ShareGPT)")
    p.add_argument("--to", required=True, metavar="ADDR",
                   help="the store's master: HOST:RPC_PORT/METADATA_PORT")
    p.add_argument("--run", required=True, help="the stream run's name (train's --data)")
    p.add_argument("--max-len", type=int, default=2048, help="token limit per conversation")
    p.add_argument("--batch-tokens", type=int, default=16384,
                   help="tokens per engine call (default 16384)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="the states' dtype (default: float32 on CPU, the target's dtype on GPU)")
    add_engine_options(p)
    add_pool_options(p)
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def run(args: argparse.Namespace, ev: Emitter) -> int:
    from engine.capture.vllm_engine import keep_stdout_for, parse_engine_args
    from engine.capture.vllm_stream import stream_capture
    from engine.stream.address import StreamAddress
    from engine.stream.pool import Watermarks

    address = StreamAddress.parse(args.to, "--to")
    marks = Watermarks.make(args.high_samples, args.low_samples, args.high_gb, args.low_gb)
    engine_args = parse_engine_args(args.engine_arg)
    keep_stdout_for(ev)
    out = stream_capture(
        args.target, args.data, address, args.run, marks, tp=args.tp,
        gpu_memory_utilization=args.gpu_memory_utilization, max_len=args.max_len,
        dtype=args.dtype, batch_tokens=args.batch_tokens, engine_args=engine_args,
        check_every=args.check_every, reference=args.reference_check,
        plan_timeout_s=args.plan_timeout, ev=ev)
    ev.answer(out, args.json, lambda d: (
        f"captured and streamed {d['samples']} samples ({d['bytes'] / 2**20:.1f} MiB, "
        f"{d['tokens_per_s']} tokens/s) to run {d['run']}; paused {d['pauses']} times, "
        f"{d['paused_s']:.1f} s; at most {d['peak_in_flight']} in flight"))
    return 0
