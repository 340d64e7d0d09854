"""One training step timed the same way in every step benchmark: ours (benchmarks/train.py's
step worker) and speculators' (benchmarks/train_vs_speculators.py, run in its own venv).
Standard library only, so any interpreter imports it (both scripts run with benchmarks/ first
on sys.path)."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable


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
