"""One training step timed the same way in every step benchmark: ours (benchmarks/train.py's
step worker) and speculators' (benchmarks/train_vs_speculators.py, run in its own venv).
Standard library only, so any interpreter imports it (both scripts run with benchmarks/ first
on sys.path)."""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable
from typing import Any


def rss_kb() -> int:
    """This process's resident set now (the baseline taken after imports)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def time_steps(step: Callable[[], object], steps: int, tokens: int, base_kb: int
               ) -> dict[str, float]:
    """One warm-up step, then `steps` timed ones: tokens/s of the fastest step, and the peak
    RSS above `base_kb` in MB."""
    step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"tokens_per_s": tokens / min(times), "peak_mb": (peak_kb - base_kb) / 1024}


def median_rows(runs: dict[tuple[int, int, bool, str], list[dict[str, Any]]],
                configs: list[tuple[int, int, bool]], num: str, den: str
                ) -> list[dict[str, Any]]:
    """Per configuration (hidden, K, lm_head frozen), over the repeats of both sides: the median
    tokens/s and peak MB of each (`SIDE_tok_s`, `SIDE_peak_mb`) and the ratio num / den."""
    rows = []
    for h, k, fr in configs:
        med = {s: {key: statistics.median(x[key] for x in runs[(h, k, fr, s)])
                   for key in ("tokens_per_s", "peak_mb")} for s in (den, num)}
        row: dict[str, Any] = {"hidden": h, "k": k, "lm_head_frozen": fr}
        row.update({f"{s}_tok_s": round(med[s]["tokens_per_s"], 1) for s in (den, num)})
        row["ratio"] = round(med[num]["tokens_per_s"] / med[den]["tokens_per_s"], 3)
        row.update({f"{s}_peak_mb": round(med[s]["peak_mb"]) for s in (den, num)})
        rows.append(row)
    return rows


def print_rows(rows: list[dict[str, Any]], first: str, second: str,
               shown: tuple[str, str] | None = None) -> None:
    """The table of `median_rows`: the sides `first` and `second` in that order, headed by
    their names or `shown` (at most 5 characters each, to keep the columns)."""
    a, b = shown or (first, second)
    print(f"    hidden  K  lm_head  {a + ' tok/s':>11} {b + ' tok/s':>11}   ratio "
          f"{a + ' MB':>8} {b + ' MB':>8}")
    for r in rows:
        head = "frozen" if r["lm_head_frozen"] else "trained"
        print(f"    {r['hidden']:>6} {r['k']:>2}  {head:<8} {r[f'{first}_tok_s']:>11} "
              f"{r[f'{second}_tok_s']:>11} {r['ratio']:>6.2f}x "
              f"{r[f'{first}_peak_mb']:>8} {r[f'{second}_peak_mb']:>8}")
