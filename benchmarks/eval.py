"""Benchmark: `engine eval` fast path vs the reference path, side by side on the demo eval set.

    python benchmarks/eval.py [--demo DIR] [--samples 64] [--rounds 3] [--json]

Both paths run in this process on the same loaded files, interleaved (reference, fast, reference,
fast, ...) after one untimed warm-up of each; the figures are ratios of medians: of the whole
call (loading the target and drafter included, the same for both) and of the evaluation after
loading (engine/training/evaluate.py's `eval_seconds`: generation, features, drafting, counting).
The reference path generates one sample at a time and runs the drafter once per draft window; the
fast path batches samples through the target and drafts from every position in k passes
(engine/training/evaluate.py). The two must report the same counts; the benchmark fails if they do
not. Goal: fast >= 10x reference on 2 CPU cores.
Without --demo, a demo workspace is built in a temporary directory first (about a minute).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.training.evaluate import evaluate

COUNTS = ("acceptance_length", "per_position", "drafts", "accepted", "generated_tokens")


def one(demo: Path, draft: str, samples: int, reference: bool
        ) -> tuple[float, float, dict[str, Any]]:
    t0 = time.perf_counter()
    res = evaluate(str(demo / draft), str(demo / "target"), str(demo / "eval"), k=3,
                   max_samples=samples, reference=reference)
    return time.perf_counter() - t0, float(res["eval_seconds"]), res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo", help="an existing demo workspace (engine demo init DIR)")
    ap.add_argument("--draft", default="public-drafter", help="drafter dir inside the workspace")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        demo = Path(a.demo) if a.demo else Path(tmp) / "demo"
        if not a.demo:
            subprocess.run([sys.executable, "-m", "engine", "demo", "init", str(demo)],
                           check=True, stdout=subprocess.DEVNULL)
        one(demo, a.draft, 4, True)  # warm-up: imports, first-call allocations
        one(demo, a.draft, 4, False)
        ref_s, fast_s, ref_e, fast_e = [], [], [], []
        ref_res: dict[str, Any] = {}
        fast_res: dict[str, Any] = {}
        for _ in range(a.rounds):
            s, e, ref_res = one(demo, a.draft, a.samples, True)
            ref_s.append(s)
            ref_e.append(e)
            s, e, fast_res = one(demo, a.draft, a.samples, False)
            fast_s.append(s)
            fast_e.append(e)
    same = {c: (ref_res[c], fast_res[c]) for c in COUNTS if ref_res[c] != fast_res[c]}
    med = statistics.median
    out = {"samples": fast_res["samples"], "rounds": a.rounds,
           "reference_eval_s": round(med(ref_e), 3), "fast_eval_s": round(med(fast_e), 3),
           "eval_speedup": round(med(ref_e) / med(fast_e), 1),
           "reference_s": round(statistics.median(ref_s), 3),
           "fast_s": round(statistics.median(fast_s), 3),
           "speedup": round(statistics.median(ref_s) / statistics.median(fast_s), 1),
           "reference_range_s": [round(min(ref_s), 3), round(max(ref_s), 3)],
           "fast_range_s": [round(min(fast_s), 3), round(max(fast_s), 3)],
           "acceptance_length": fast_res["acceptance_length"], "drafts": fast_res["drafts"],
           "counts_differ": same}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"eval of {out['samples']} demo samples, k=3, median of {a.rounds}:")
        print(f"  evaluation after loading: reference {out['reference_eval_s']:.2f} s, fast "
              f"{out['fast_eval_s']:.2f} s -> {out['eval_speedup']}x (goal >= 10x)")
        print(f"  whole call, loading included: reference {out['reference_s']:.2f} s, fast "
              f"{out['fast_s']:.2f} s -> {out['speedup']}x")
        print(f"  acceptance length {out['acceptance_length']:.3f} over {out['drafts']} drafts; "
              f"counts {'DIFFER ' + str(same) if same else 'identical'}")
    return 1 if same else 0


if __name__ == "__main__":
    raise SystemExit(main())
