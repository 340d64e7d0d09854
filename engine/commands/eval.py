"""`python -m engine eval`: mean acceptance length of a drafter, counted like vLLM."""

from __future__ import annotations

import argparse
from typing import Any

from engine.events import Emitter

HELP = "replay greedy speculative decoding on held-out samples: acceptance length, per position"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft", required=True, help="drafter directory (any style)")
    p.add_argument("--target", required=True, help="target model directory")
    p.add_argument("--data", required=True, help="prepared data directory (held-out samples)")
    p.add_argument("--steps", type=int, default=3, help="K drafted tokens per step (default 3)")
    p.add_argument("--max-samples", type=int, default=64, help="samples replayed (default 64)")
    p.add_argument("--max-new-tokens", type=int, default=64,
                   help="greedy tokens generated per sample (default 64)")
    p.add_argument("--batch-size", type=int, default=64,
                   help="at most N samples generated and replayed together (default 64)")
    p.add_argument("--batch-tokens", type=int, default=32768,
                   help="at most N tokens (prompt + generated, padded) in a batch's KV cache "
                        "(default 32768)")
    p.add_argument("--reference", action="store_true",
                   help="one sample and one draft window at a time (slow; to check the fast path)")
    p.add_argument("--device", help="torch device (default: cuda if present, else cpu)")
    p.add_argument("--vllm-engine", action="store_true",
                   help="run the target in vLLM with the drafter as its speculative config and "
                        "count with vLLM's own counters (a vLLM-loadable drafter; for targets "
                        "transformers cannot hold)")
    p.add_argument("--tp", type=int, default=1, help="--vllm-engine: tensor parallel size")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace, ev: Emitter) -> int:
    if args.vllm_engine:
        from engine.capture.vllm_engine import keep_stdout_for
        from engine.training.vllm_eval import evaluate_vllm
        keep_stdout_for(ev)  # vLLM logs to stdout, which is the answer's
        res = evaluate_vllm(args.draft, args.target, args.data, k=args.steps,
                            max_samples=args.max_samples, max_new_tokens=args.max_new_tokens,
                            tp=args.tp, ev=ev)
        return _answer(res, args, ev)
    from engine.training.evaluate import evaluate
    res = evaluate(args.draft, args.target, args.data, k=args.steps,
                   max_samples=args.max_samples, max_new_tokens=args.max_new_tokens,
                   device=args.device, ev=ev, batch_size=args.batch_size,
                   batch_tokens=args.batch_tokens,
                   reference=args.reference)
    return _answer(res, args, ev)


def _answer(res: dict[str, Any], args: argparse.Namespace, ev: Emitter) -> int:
    ev.answer(res, args.json, lambda r: (
        f"Mean acceptance length: {r['acceptance_length']:.2f}, Per-position acceptance rate: "
        + ", ".join(f"{x:.3f}" for x in r["per_position"])
        + f" ({r['drafts']} drafts, {r['samples']} samples, k={r['steps']})"), indent=None)
    return 0
