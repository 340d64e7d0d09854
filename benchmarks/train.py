"""Benchmark: prepare's capture overhead and the trainer's throughput on the demo preset.

    python benchmarks/train.py [--demo DIR] [--steps 60] [--json]

(a) prepare vs a bare target forward on the same batches: the bare pass runs the target's decoder
    stack (`model.model`, what any capture needs at least); prepare runs the same batches through
    the aux-capturing forward, slices the samples and writes the safetensors shards. Tokenization
    is excluded from both. Goal: prepare throughput >= 0.85 x bare.
(b) training tokens/s with the demo's suggested settings, offline (features from the shards; the
    "target" share is recomputing target logits from the final hidden state) and online (the
    target runs inside the loop), with the share of step time per phase: data, target forward,
    draft forward (TTT unroll + loss), backward, optimizer.
Without --demo, a demo workspace is built in a temporary directory first (about a minute).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from engine.conversations import read_conversations  # noqa: E402
from engine.events import Emitter  # noqa: E402


def quiet() -> Emitter:
    return Emitter("bench", out=io.StringIO(), err=io.StringIO())


def bench_prepare(demo: Path, work: Path, repeats: int = 3) -> dict[str, Any]:
    from engine.prepare import length_batches, pad_batch, prepare, tokenize_all
    from engine.target import Target
    target = Target.load(str(demo / "target"), device="cpu")
    src = demo / "conversations" / "train.jsonl"
    samples, _ = tokenize_all(target.tokenizer, read_conversations(str(src)), 2048)
    lengths = [len(t.input_ids) for _, t in samples]
    batches = [pad_batch([samples[i][1].input_ids for i in b])
               for b in length_batches(lengths, 16384)]
    tokens = sum(lengths)
    bare, prep = [], []
    for r in range(repeats):
        t0 = time.perf_counter()
        with torch.no_grad():
            for ids, att in batches:
                target.model.model(input_ids=ids, attention_mask=att, use_cache=False)
        bare.append(time.perf_counter() - t0)
        out = work / f"prep{r}"
        m = prepare(str(demo / "target"), str(src), str(out), target=target)
        prep.append(float(m["seconds"]))  # features + slicing + shard writes (no tokenization)
        shutil.rmtree(out)
    b, p = min(bare), min(prep)
    return {"tokens": tokens, "bare_s": round(b, 4), "prepare_s": round(p, 4),
            "bare_tok_s": round(tokens / b), "prepare_tok_s": round(tokens / p),
            "ratio": round(b / p, 3)}


def bench_train(demo: Path, work: Path, steps: int, online: bool) -> dict[str, Any]:
    from engine.demo import DRAFT_VOCAB, TRAIN_ARGS
    from engine.train import train
    from engine.train_config import TrainConfig
    args = dict(zip(TRAIN_ARGS[::2], TRAIN_ARGS[1::2], strict=False))
    data = demo / "conversations" / "train.jsonl" if online else demo / "data"
    out = work / ("online" if online else "offline")
    cfg = TrainConfig(target=str(demo / "target"), data=str(data), out=str(out),
                      draft_vocab_size=DRAFT_VOCAB, max_steps=steps, lr=float(args["--lr"]),
                      batch_tokens=int(args["--batch-tokens"]),
                      ttt_steps=int(args["--ttt-steps"]), epochs=40, save_every=0, holdout=0,
                      online=online)
    ev = quiet()
    try:
        train(cfg, ev)
    finally:
        ev.close()
    lines = (out / "events.jsonl").read_text().splitlines()
    metrics = [json.loads(line)["values"] for line in lines if '"kind":"metric"' in line]
    metrics = metrics[min(5, len(metrics) // 4):]  # skip warm-up steps
    step_s = sum(m["step_time_s"] for m in metrics)
    phases = {}
    for name in ("data", "target", "draft", "backward", "optimizer"):
        phases[name] = round(sum(m.get(f"t_{name}_s", 0.0) for m in metrics) / step_s, 3)
    shutil.rmtree(out)
    tokens = sum(m["tokens"] for m in metrics)
    return {"steps": len(metrics), "tokens_per_s": round(tokens / step_s),
            "step_ms": round(1000 * step_s / len(metrics), 1), "share": phases,
            "final_acc_0": round(metrics[-1]["acc_0"], 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--demo", help="existing demo workspace (default: build one)")
    ap.add_argument("--steps", type=int, default=60, help="training steps per mode")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    work = Path(tempfile.mkdtemp(prefix="eagle3-bench-"))
    try:
        if args.demo:
            demo = Path(args.demo)
        else:
            from engine.demo import init_demo
            demo = work / "demo"
            t0 = time.perf_counter()
            init_demo(str(demo), quiet())
            print(f"demo init: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        res = {"threads": torch.get_num_threads(), "prepare": bench_prepare(demo, work),
               "train_offline": bench_train(demo, work, args.steps, online=False),
               "train_online": bench_train(demo, work, args.steps, online=True)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    p = res["prepare"]
    print(f"(a) prepare vs bare target forward, {p['tokens']} tokens, {res['threads']} thread(s)")
    print(f"    bare forward  {p['bare_tok_s']:>9} tok/s   ({p['bare_s']:.3f}s)")
    print(f"    prepare       {p['prepare_tok_s']:>9} tok/s   ({p['prepare_s']:.3f}s)   "
          f"ratio {p['ratio']:.2f}x (goal >= 0.85x)")
    print("(b) training, demo preset           offline      online")
    off, on = res["train_offline"], res["train_online"]
    print(f"    tokens/s                   {off['tokens_per_s']:>10} {on['tokens_per_s']:>11}")
    print(f"    step (ms)                  {off['step_ms']:>10} {on['step_ms']:>11}")
    for name in ("data", "target", "draft", "backward", "optimizer"):
        print(f"    share {name:<20} {off['share'][name] * 100:>9.1f}% "
              f"{on['share'][name] * 100:>10.1f}%")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
