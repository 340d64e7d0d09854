"""`python -m engine convert SRC DST --to {eagle,speculators,vllm,sglang}`: restyle or export.

Streams tensor by tensor (peak memory near the largest tensor), keeps tensor bytes identical unless
`--dtype` asks for a cast, writes into a temp dir beside DST and renames it at the end, and records
provenance.json (source path and sha256, source format, key mapping, engine version, time).
The work is engine/ckpt/converter.py; this module is the command line.
"""

from __future__ import annotations

import argparse

from engine.events import Emitter

HELP = "convert a drafter between EAGLE and speculators styles, or export it for vLLM / SGLang"
TARGETS = ("eagle", "speculators", "vllm", "sglang")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="drafter directory (EAGLE or speculators style, any weight layout)")
    p.add_argument("dst", help="output directory (must not exist, or be a drafter directory "
                               "with --force)")
    p.add_argument("--to", required=True, choices=TARGETS, help="output style / serving engine")
    p.add_argument("--verifier", metavar="NAME_OR_PATH",
                   help="the target model, recorded in the speculators config")
    p.add_argument("--dtype", choices=("keep", "bf16", "fp16", "fp32"), default="keep",
                   help="cast floating-point tensors (default: keep the stored bytes)")
    p.add_argument("--speculative-tokens", type=int, default=3, metavar="K",
                   help="greedy proposal length in the speculators config (default: 3)")
    emb = p.add_mutually_exclusive_group()
    emb.add_argument("--embed-from", metavar="TARGET_DIR",
                     help="add the target model's embedding as embed_tokens.weight")
    emb.add_argument("--drop-embed", action="store_true", help="leave embed_tokens.weight out")
    p.add_argument("--force", action="store_true",
                   help="replace DST if it is a drafter directory (config.json and weights, "
                        "nothing else) or empty; anything else is refused")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")


def run(args: argparse.Namespace, ev: Emitter) -> int:
    import sys
    from pathlib import Path

    from engine.ckpt.converter import convert_checkpoint
    from engine.ckpt.output_dir import Terminated, termination_raises
    from engine.errors import UsageError

    if args.speculative_tokens < 1:
        raise UsageError("--speculative-tokens must be >= 1")
    try:
        # SIGTERM/SIGHUP (the console stopping a remote convert) unwind like Ctrl-C, so the
        # temp output beside DST is removed before the process exits.
        with termination_raises():
            summary = convert_checkpoint(
                Path(args.src), Path(args.dst), args.to, verifier=args.verifier,
                dtype=args.dtype, speculative_tokens=args.speculative_tokens,
                embed_from=Path(args.embed_from) if args.embed_from else None,
                drop_embed=args.drop_embed, force=args.force, ev=ev)
    except Terminated as e:
        msg = f"stopped by {e} (no partial output left beside {args.dst})"
        ev.error(msg, "Terminated")
        print(f"error: {msg}", file=sys.stderr)
        return 128 + e.signum
    ev.answer(summary, args.json, lambda s: (
        f"wrote {s['dst']} ({args.to} style from {s['source_format']}, {s['tensors']} tensors, "
        f"{s['bytes'] / 2**20:.1f} MiB, {s['seconds']:.2f} s)"))
    return 0
