"""`python -m engine train`: train or finetune an EAGLE-3 drafter (see engine/training/train.py)."""

from __future__ import annotations

import argparse
from typing import Any

from engine.events import Emitter

HELP = "train or finetune an EAGLE-3 drafter on prepared target features (torchrun for many GPUs)"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="target model directory")
    p.add_argument("--data", required=True,
                   help="prepared data directory (or a SpecForge data_*.ckpt directory; a "
                   "conversations JSONL with --online)")
    p.add_argument("--out", required=True, help="run directory (checkpoints, events, final/)")
    p.add_argument("--finetune-from", metavar="CKPT",
                   help="start from this drafter (EAGLE, SpecForge, AQ-MedAI or speculators style)")
    v = p.add_mutually_exclusive_group()
    v.add_argument("--vocab", metavar="FILE", help="draft vocab file (engine vocab build)")
    v.add_argument("--rebuild-vocab", action="store_true",
                   help="build the draft vocab from DATA (re-indexes a finetune's lm_head rows)")
    p.add_argument("--draft-vocab-size", type=int, help="Vd of a vocab built here")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoints/latest")
    p.add_argument("--ttt-steps", type=int, default=7, help="draft steps unrolled (default 7)")
    p.add_argument("--lr", type=float, default=1e-4, help="peak learning rate (default 1e-4)")
    p.add_argument("--epochs", type=int, default=10, help="passes over the data (default 10)")
    p.add_argument("--max-steps", type=int, help="stop after this many optimizer steps")
    p.add_argument("--batch-tokens", type=int, default=8192,
                   help="padded tokens per micro-batch per rank (default 8192)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step per rank")
    p.add_argument("--warmup-ratio", type=float, default=0.015,
                   help="share of steps warming up (default 0.015)")
    p.add_argument("--save-every", type=int, default=500,
                   help="checkpoint every N steps (default 500; 0 = only at the end)")
    p.add_argument("--keep", type=int, default=3, help="step checkpoints kept (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and data order")
    p.add_argument("--holdout", type=int,
                   help="samples held out to pick best/ (default min(64, 5%%); 0 = none)")
    p.add_argument("--online", action="store_true",
                   help="compute target features in the loop (--data is a conversations JSONL)")
    p.add_argument("--max-len", type=int, default=2048, help="token limit per conversation "
                   "(--online)")
    p.add_argument("--from-vllm", metavar="URL",
                   help="with --online: stream features from this vLLM server (engine "
                   "capture-server) instead of loading the target")
    p.add_argument("--model", dest="vllm_model", help="served model name (--from-vllm)")
    p.add_argument("--concurrency", type=int, default=16,
                   help="requests in flight (--from-vllm, default 16)")
    p.add_argument("--prefetch", type=int, default=4,
                   help="micro-batches fetched ahead (--from-vllm, default 4)")
    p.add_argument("--fsdp", action="store_true", help="shard the drafter (FSDP) under torchrun")
    p.add_argument("--freeze-lm-head", action="store_true",
                   help="keep the drafter's lm_head fixed (speculators' default; trained by "
                   "default)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the draft's TTT step (CPU or CUDA)")
    p.add_argument("--checkpoint-activations", action="store_true",
                   help="recompute each TTT step's decoder layer in the backward (less memory)")
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16",
                   help="CUDA autocast: bf16 (default) or fp32; CPU is always fp32")
    p.add_argument("--device", help="torch device (default: cuda:LOCAL_RANK if present, else cpu)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def run(args: argparse.Namespace, ev: Emitter) -> int:
    import os
    import sys

    from engine.training.config import TrainConfig
    from engine.training.train import train
    cfg = TrainConfig(target=args.target, data=args.data, out=args.out,
                      finetune_from=args.finetune_from, vocab=args.vocab,
                      rebuild_vocab=args.rebuild_vocab, draft_vocab_size=args.draft_vocab_size,
                      resume=args.resume, ttt_steps=args.ttt_steps, lr=args.lr,
                      epochs=args.epochs, max_steps=args.max_steps,
                      batch_tokens=args.batch_tokens, grad_accum=args.grad_accum,
                      warmup_ratio=args.warmup_ratio, save_every=args.save_every,
                      keep=args.keep, seed=args.seed, holdout=args.holdout, online=args.online,
                      max_len=args.max_len, fsdp=args.fsdp, device=args.device,
                      from_vllm=args.from_vllm, vllm_model=args.vllm_model,
                      concurrency=args.concurrency, prefetch=args.prefetch,
                      freeze_lm_head=args.freeze_lm_head, compile=args.compile,
                      checkpoint_activations=args.checkpoint_activations,
                      precision=args.precision)
    result = train(cfg, ev, argv=sys.argv)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0  # under torchrun, rank 0 alone reports
    def text(r: dict[str, Any]) -> str:
        m = r["metrics"]
        return (f"trained {r['steps']} steps: loss {m.get('loss', float('nan')):.4f}, "
                f"acc_0 {m.get('acc_0', 0):.3f}, estimated tau {m.get('tau', 0):.3f}; "
                f"drafter in {r['final']} (best: {r['best']})")

    ev.answer(result, args.json, text)
    return 0
