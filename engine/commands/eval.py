"""`python -m engine eval`: mean acceptance length of a drafter, counted like vLLM."""

from __future__ import annotations

import argparse

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
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace, ev: Emitter) -> int:
    from engine.training.evaluate import evaluate
    res = evaluate(args.draft, args.target, args.data, k=args.steps,
                   max_samples=args.max_samples, max_new_tokens=args.max_new_tokens,
                   device=args.device, ev=ev, batch_size=args.batch_size,
                   batch_tokens=args.batch_tokens,
                   reference=args.reference)
    ev.answer(res, args.json, lambda r: (
        f"Mean acceptance length: {r['acceptance_length']:.2f}, Per-position acceptance rate: "
        + ", ".join(f"{x:.3f}" for x in r["per_position"])
        + f" ({r['drafts']} drafts, {r['samples']} samples, k={r['steps']})"), indent=None)
    return 0
