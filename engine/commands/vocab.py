"""`python -m engine vocab {build,remap}`: draft vocab maps and lm_head re-indexing.

    vocab build --data DATA --draft-vocab-size N --out vocab.safetensors [--vocab-size V|--target T]
        DATA: a JSONL of {"input_ids", "loss_mask"} or a prepared data directory (manifest.json +
        safetensors shards; exact format in engine/ckpt/vocab.py). Counts only loss-masked tokens.
    vocab remap CKPT --vocab NEW --out DST [--target TARGET_DIR] [--force]
        Moves lm_head rows of kept tokens exactly; new rows from the target's lm_head or the mean.
"""

from __future__ import annotations

import argparse

from engine.events import Emitter

HELP = "build a draft vocab (d2t/t2d) from data, or remap a drafter's lm_head to a new vocab"


def _common(p: argparse.ArgumentParser) -> None:
    # Accept the engine-wide flags after the sub-command too (SUPPRESS keeps the parent's value).
    p.add_argument("--events", action="store_true", default=argparse.SUPPRESS,
                   help="write JSON-line events on stdout")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show tracebacks on failure")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")


def configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="vocab_cmd", metavar="{build,remap}", parser_class=type(p))
    sub.required = True
    b = sub.add_parser("build", help="draft vocab from loss-masked token counts",
                       description="draft vocab from loss-masked token counts")
    b.add_argument("--data", required=True, help="JSONL file or prepared data directory")
    b.add_argument("--draft-vocab-size", type=int, required=True, metavar="N")
    b.add_argument("--out", required=True, help="vocab file to write (safetensors: d2t, t2d)")
    src = b.add_mutually_exclusive_group()
    src.add_argument("--vocab-size", type=int, metavar="V", help="target vocab size")
    src.add_argument("--target", metavar="TARGET_DIR", help="read V from the target's config")
    _common(b)
    r = sub.add_parser("remap", help="re-index a drafter's lm_head for a new vocab",
                       description="re-index a drafter's lm_head for a new vocab")
    r.add_argument("ckpt", help="drafter directory (any style)")
    r.add_argument("--vocab", required=True, help="the new vocab file")
    r.add_argument("--out", required=True, help="output drafter directory")
    r.add_argument("--target", metavar="TARGET_DIR",
                   help="initialise rows of new tokens from the target's lm_head (else the mean)")
    r.add_argument("--force", action="store_true", help="replace --out if it exists")
    _common(r)


def _target_vocab_size(target: str) -> int:
    from pathlib import Path

    from engine.ckpt.vocab import check_vocab_size
    from engine.errors import EngineError
    from engine.fileio import read_json

    path = Path(target) / "config.json"
    conf = read_json(path, missing="missing")
    v = conf.get("vocab_size")
    if v is None and isinstance(conf.get("text_config"), dict):
        v = conf["text_config"].get("vocab_size")
    if not isinstance(v, int) or v <= 0:
        raise EngineError(f"{path}: field 'vocab_size' missing or not a positive integer")
    return check_vocab_size(v, f"{path}: field 'vocab_size'")


def run(args: argparse.Namespace, ev: Emitter) -> int:
    from pathlib import Path

    from engine.ckpt import vocab

    if args.vocab_cmd == "build":
        v = args.vocab_size if args.vocab_size else (
            _target_vocab_size(args.target) if args.target else None)
        counts, v = vocab.count_tokens(Path(args.data), v, ev)
        d2t, t2d = vocab.build_vocab(counts, args.draft_vocab_size)
        cov = vocab.coverage(counts, t2d)
        summary = {"out": args.out, "vocab_size": v, "draft_vocab_size": args.draft_vocab_size,
                   "masked_tokens": int(counts.sum()), "distinct_tokens": int((counts > 0).sum()),
                   "coverage": cov}
        vocab.save_vocab(Path(args.out), d2t, t2d,
                         {"coverage": cov, "vocab_size": v, "data": str(Path(args.data).resolve()),
                          "masked_tokens": summary["masked_tokens"]})
        text = (f"wrote {args.out}: Vd {args.draft_vocab_size} of V {v}, coverage "
                f"{cov * 100:.2f}% of {summary['masked_tokens']} assistant tokens "
                f"({summary['distinct_tokens']} distinct)")
    else:
        summary = vocab.remap_drafter(Path(args.ckpt), Path(args.vocab), Path(args.out),
                                      Path(args.target) if args.target else None, args.force)
        text = (f"wrote {summary['dst']} ({summary['style']} style): {summary['kept']} of "
                f"{summary['new_size']} rows kept ({summary['overlap'] * 100:.1f}% overlap), "
                f"{summary['new']} new from {summary['new_rows_from']}, {summary['dropped']} "
                "dropped")
    ev.answer(summary, args.json, lambda _: text)
    return 0
