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

    python benchmarks/train.py --step-compare [--hidden 256 1024] [--k 3 7] [--repeats 3]
                               [--steps 2] [--lm-head trained frozen]

(c) the training step alone, old (dense [T, (i+1)T] attention mask, full-vocab target logits,
    shifted copies of p, log_softmax + product sum) against new
    (the trainer's own forward, engine/training/unroll.py: the split TTT attention, the stored
    argmax, the fused lm_head + soft cross-entropy over chunks of the supervised rows),
    at float32, 2 threads, T=1024, batch 1, 8 heads / 4 kv heads, target vocab 32000, draft vocab
    8000; each measurement a fresh process, old and new interleaved, medians over repeats:
    tokens/s, new/old ratio, peak RSS above the after-import baseline.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from engine.data.conversations import read_conversations
from engine.events import Emitter  # noqa: E402


def quiet() -> Emitter:
    return Emitter("bench", out=io.StringIO(), err=io.StringIO())


def bench_prepare(demo: Path, work: Path, repeats: int = 3) -> dict[str, Any]:
    from engine.data.prepare import length_batches, pad_batch, prepare, tokenize_all
    from engine.data.target import Target
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
    from engine.demo.workspace import DRAFT_VOCAB, TRAIN_ARGS
    from engine.training.config import TrainConfig
    from engine.training.train import train
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


STEP_SHAPE = {"t": 1024, "v": 32000, "vd": 8000, "heads": 8, "kv_heads": 4, "threads": 2}


def step_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """One process, one (impl, hidden, k, freeze) measurement (section (c) of the docstring)."""
    from step_timing import rss_kb, time_steps  # benchmarks/ is sys.path[0]

    # what the steps below import, imported before the RSS baseline is taken
    import engine.model.draft  # noqa: F401
    import engine.model.ttt_loss  # noqa: F401
    torch.set_num_threads(STEP_SHAPE["threads"])
    base_kb = rss_kb()
    draft = step_draft(spec)
    step = make_step(spec, draft, step_inputs(spec, draft))
    return time_steps(step, spec["steps"], STEP_SHAPE["t"], base_kb)


def step_draft(spec: dict[str, Any]) -> Any:
    """The draft measured: STEP_SHAPE at spec's hidden size, seeded, its draft vocab spread over
    the target vocab, with the old (dense) or new (split) attention, the lm head frozen or not."""
    from engine.model.draft import Eagle3Draft, preset
    h, v, vd = spec["hidden"], STEP_SHAPE["v"], STEP_SHAPE["vd"]
    cfg = preset("tiny").with_(hidden_size=h, intermediate_size=h * 7 // 2,
                                num_attention_heads=STEP_SHAPE["heads"],
                                num_key_value_heads=STEP_SHAPE["kv_heads"],
                                head_dim=h // STEP_SHAPE["heads"], target_hidden_size=h,
                                vocab_size=v, draft_vocab_size=vd,
                                norm_before_fc=bool(spec.get("eagle31")),
                                norm_output=bool(spec.get("eagle31")))
    torch.manual_seed(0)
    draft = Eagle3Draft(cfg)
    draft.d2t.copy_(torch.arange(vd) * (v // vd) - torch.arange(vd))  # spread over the vocab
    draft.t2d.zero_()
    draft.t2d[torch.arange(vd) * (v // vd)] = True
    draft.attn_impl = "dense" if spec["impl"] == "old" else "split"
    if spec.get("freeze"):
        draft.lm_head.weight.requires_grad_(False)
    return draft


def step_inputs(spec: dict[str, Any], draft: Any) -> dict[str, Any]:
    """One batch of random features and targets for the step (drawn after the draft's weights,
    from the same seeded generator), the stored argmax forced to spec's coverage if given."""
    from engine.model.ttt_loss import draft_head, target_argmax
    h, t, v, vd = spec["hidden"], STEP_SHAPE["t"], STEP_SHAPE["v"], STEP_SHAPE["vd"]
    lm_head = torch.randn(v, h) * 0.05
    draft_ids = draft.d2t + torch.arange(vd)
    head_d = draft_head(lm_head, draft_ids)
    aux = torch.randn(1, t, 3 * h)
    hidden = torch.randn(1, t, h)
    ids = torch.randint(0, v, (1, t))
    att = torch.ones(1, t, dtype=torch.long)
    loss_mask = torch.ones(1, t, dtype=torch.long)
    stored_top = target_argmax(hidden, lm_head, rows=256)  # what prepare stores
    cover = spec.get("coverage")
    if cover is not None:  # force this fraction of targets into the draft vocab (else ~Vd/V)
        g = torch.Generator().manual_seed(1)
        inside = torch.rand(stored_top.shape, generator=g) < cover
        ins = draft_ids[torch.randint(0, vd, stored_top.shape, generator=g)]
        outs = torch.nonzero(~draft.t2d).squeeze(1)
        outs = outs[torch.randint(0, outs.numel(), stored_top.shape, generator=g)]
        stored_top = torch.where(inside, ins, outs)
    # the trainer reads only the draft rows when the data stores the argmax: the new step
    # keeps no full lm head (returned to the caller only for the old one)
    return {"lm_head": lm_head if spec["impl"] == "old" else None, "draft_ids": draft_ids,
            "head_d": head_d, "aux": aux, "hidden": hidden, "ids": ids, "att": att,
            "loss_mask": loss_mask, "stored_top": stored_top}


def make_step(spec: dict[str, Any], draft: Any, inputs: dict[str, Any]) -> Callable[[], float]:
    """The timed training step (target side, TTT forward, loss, backward, optimizer), old or new
    as spec says; returns the loss."""
    import torch.nn.functional as F

    from engine.model.draft import shift_left
    from engine.model.ttt_loss import STEP_WEIGHT, TargetSide, step_rows
    from engine.training.unroll import Unroll
    old, k = spec["impl"] == "old", spec["k"]
    unroll = Unroll(draft, k)  # the trainer's own forward: the TTT unroll and its fused loss
    lm_head, draft_ids, head_d = inputs["lm_head"], inputs["draft_ids"], inputs["head_d"]
    aux, hidden, ids, att = inputs["aux"], inputs["hidden"], inputs["ids"], inputs["att"]
    loss_mask, stored_top = inputs["loss_mask"], inputs["stored_top"]
    del inputs
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=1e-4,
                            betas=(0.9, 0.95))
    denom = float(STEP_SHAPE["t"] - 2)

    def step() -> float:
        with torch.no_grad():
            if old:
                logits = hidden @ lm_head.T
                top = logits.argmax(-1)
                p = torch.softmax(logits[..., draft_ids].float(), dim=-1)
                in_vocab = draft.t2d[top]
            else:  # as the trainer's _micro: p is made chunk by chunk inside the loss
                top = stored_top
                in_vocab = draft.t2d[top]
                rows = step_rows(loss_mask, in_vocab, k)  # the positions the loss reads
        if old:
            out = draft.ttt_forward(aux, ids, k, attention_mask=att)
            loss = p.new_zeros(())
            for i, lg in enumerate(out):
                mask = shift_left(loss_mask, 2 + i).bool() & shift_left(in_vocab, 1 + i)
                ce = -(shift_left(p, 1 + i) * F.log_softmax(lg.float(), dim=-1)).sum(-1)
                loss = loss + STEP_WEIGHT ** i * (ce * mask).sum() / denom
        else:
            loss, _ = unroll(aux, ids, att, rows, TargetSide(hidden, head_d, top, in_vocab),
                             loss_mask, denom)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def step_compare(hiddens: list[int], ks: list[int], repeats: int, steps: int,
                 heads: list[str]) -> dict[str, Any]:
    import subprocess

    from step_timing import median_rows
    configs = [(h, k, fr == "frozen") for h in hiddens for k in ks for fr in heads]
    runs: dict[tuple[int, int, bool, str], list[dict[str, Any]]] = {}
    for r in range(repeats):
        for h, k, fr in configs:
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            for impl in order:
                spec = {"impl": impl, "hidden": h, "k": k, "freeze": fr, "steps": steps}
                env = dict(os.environ, OMP_NUM_THREADS=str(STEP_SHAPE["threads"]))
                p = subprocess.run([sys.executable, __file__, "--step-worker", json.dumps(spec)],
                                   capture_output=True, text=True, env=env, check=True)
                runs.setdefault((h, k, fr, impl), []).append(json.loads(p.stdout))
                print(f"  repeat {r} hidden {h} K {k} frozen {fr} {impl}: "
                      f"{runs[(h, k, fr, impl)][-1]}", file=sys.stderr)
    rows = median_rows(runs, configs, num="new", den="old")
    return {"shape": STEP_SHAPE, "repeats": repeats, "steps": steps, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--demo", help="existing demo workspace (default: build one)")
    ap.add_argument("--steps", type=int, default=60, help="training steps per mode")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--step-compare", action="store_true",
                    help="(c) only: the step old vs new in separate processes")
    ap.add_argument("--hidden", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--k", type=int, nargs="+", default=[3, 7])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--lm-head", nargs="+", choices=("trained", "frozen"), default=["trained"])
    ap.add_argument("--step-worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.step_worker:
        print(json.dumps(step_worker(json.loads(args.step_worker))))
        return 0
    if args.step_compare:
        res = step_compare(args.hidden, args.k, args.repeats, min(args.steps, 3), args.lm_head)
        if args.json:
            print(json.dumps(res, indent=2))
            return 0
        print("(c) training step, old vs new: float32, 2 threads, T=1024, batch 1, 8/4 heads, "
              "V 32000, Vd 8000; medians")
        from step_timing import print_rows
        print_rows(res["rows"], "old", "new")
        return 0
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    work = Path(tempfile.mkdtemp(prefix="eagle3-bench-"))
    try:
        if args.demo:
            demo = Path(args.demo)
        else:
            from engine.demo.workspace import init_demo
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
