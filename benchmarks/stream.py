"""Benchmark: training streamed through a Mooncake store vs training from the data directory.

    python benchmarks/stream.py [--demo DIR] [--steps 40] [--rounds 1] [--json]
    python benchmarks/stream.py --capture [...]    # the producer vs vLLM's bare prefill

On the demo, side by side in one run, the same steps and flags (the demo's suggested settings,
`--max-steps`, one trainer process with one thread):
  disk     `engine train --data DEMO/data`
  stream   a real `mooncake_master` on 127.0.0.1 (engine/stream/master.py), `engine stream-put
           --data DEMO/data` as the producer (its own process) and `engine train --from-stream
           ADDR --data RUN`
Tokens/s come from the trainer's step metrics: each step's wall time, which holds its data reads
and, streamed, its waits for the producer and its acks; the first steps are skipped as warm-up.
The sides alternate round by round and the fastest round of each counts (on a shared machine,
the least disturbed one; every round is printed). Goal: stream >= 0.9x disk.

`--capture` adds the other half, the executor capture as a producer (`engine stream-capture`,
a consumer taking what it puts) against vLLM's bare prefill of the same chats, and the executor
capture into a data directory: benchmarks/capture_engines.py's --producer measurement, with this
script's --rounds (it needs a real vLLM: $VLLM_PYTHON or .venv-vllm).

On a quiet machine: python benchmarks/stream.py --steps 200 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

QUIET_COMMAND = "python benchmarks/stream.py --steps 200 --rounds 3"
WARMUP = 5


def env() -> dict[str, str]:
    from tests.engine_helpers import engine_env
    return engine_env()


def step_figures(run: Path, launched: float) -> dict[str, Any]:
    """tokens/s over the run's training steps (the first WARMUP, or a quarter, skipped), and the
    streamed side's waiting figures when it has them."""
    from tests.engine_helpers import events
    evs = [e for e in events(run / "events.jsonl") if e["kind"] == "metric"]
    steps = [e["values"] for e in evs if "name" not in e]
    if not steps:
        raise RuntimeError(f"{run}: no training step in events.jsonl")
    timed = steps[min(WARMUP, len(steps) // 4):]
    secs = sum(float(m["step_time_s"]) for m in timed)
    tokens = sum(int(m["tokens"]) for m in timed)
    firsts = [e["t"] for e in evs if "name" not in e]
    every = events(run / "events.jsonl")
    out: dict[str, Any] = {"steps": len(steps), "timed_steps": len(timed), "tokens": tokens,
                           "seconds": round(secs, 3), "tok_s": round(tokens / secs, 1),
                           # the process's launch (time.time()) to its first step, and its
                           # last step to its last event (streamed: the manifest's wait, the
                           # plan; the clean-up)
                           "before_steps_s": round(firsts[0] - launched, 2),
                           "after_steps_s": round(every[-1]["t"] - firsts[-1], 2)}
    waits = [e["values"] for e in evs if e.get("name") == "stream trainer"]
    if waits:  # running totals: the last one holds the run's
        out.update({k: round(float(waits[-1][k]), 3) for k in ("wait_s", "read_s", "ack_s")})
    return out


def train(demo: Path, out: Path, steps: int, source: list[str]) -> dict[str, Any]:
    """One `engine train` (one process), its data from `source` (`--data DIR` or
    `--from-stream ADDR --data RUN`)."""
    from tests.engine_helpers import train_args
    args = train_args(demo, out, "--max-steps", str(steps))
    i = args.index("--data")
    args = [*args[:i], *source, *args[i + 2:]]
    t0, launched = time.perf_counter(), time.time()
    p = subprocess.run([sys.executable, "-m", "engine", *args], cwd=REPO, env=env(),
                       capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"engine train exited {p.returncode}: {p.stderr[-3000:]}")
    return {**step_figures(out, launched), "wall_s": round(time.perf_counter() - t0, 2)}


def streamed(demo: Path, out: Path, steps: int, address: str, run: str,
             producer: list[str] | None = None, python: str = sys.executable
             ) -> dict[str, Any]:
    """A producer in its own process (`python -m engine PRODUCER`: by default `stream-put` over
    the demo's data directory; `--to` and `--run` are added) and the trainer reading from the
    store."""
    logs = out.parent / f"{out.name}.producer"
    argv = producer or ["stream-put", "--data", str(demo / "data"), "--plan-timeout", "300"]
    with open(f"{logs}.out", "wb") as so, open(f"{logs}.err", "wb") as se:
        prod = subprocess.Popen([python, "-m", "engine", *argv, "--events", "--to",
                                 address, "--run", run], cwd=REPO, env=env(), stdout=so,
                                stderr=se)
    try:
        res = train(demo, out, steps, ["--from-stream", address, "--data", run,
                                      "--producer-timeout", "120"])
        rc = prod.wait(timeout=300)
    finally:
        if prod.poll() is None:
            prod.kill()
            prod.wait()
    if rc:
        raise RuntimeError(f"engine {argv[0]} exited {rc}: "
                           f"{Path(f'{logs}.err').read_text()[-3000:]}")
    from tests.engine_helpers import events
    done = [e["data"] for e in events(Path(f"{logs}.out")) if e["kind"] == "result"]
    if done:
        res["producer"] = {k: done[0][k] for k in ("samples", "bytes", "put_s", "paused_s")
                           if k in done[0]}
    return res


def measure(demo: Path, work: Path, steps: int, rounds: int) -> dict[str, Any]:
    from engine.stream.holder import default_segment_bytes
    from engine.stream.master import start_master
    runs: dict[str, list[dict[str, Any]]] = {"disk": [], "stream": []}
    with start_master("127.0.0.1", log=work / "master.log",
                      segment_bytes=default_segment_bytes()) as master:
        for r in range(rounds):
            for side in (("disk", "stream") if r % 2 == 0 else ("stream", "disk")):
                out = work / f"{side}{r}"
                got = (train(demo, out, steps, ["--data", str(demo / "data")]) if side == "disk"
                       else streamed(demo, out, steps, str(master.address), f"bench{r}"))
                runs[side].append(got)
                print(f"  round {r} {side}: {got}", file=sys.stderr)
    best = {k: max(v, key=lambda x: float(x["tok_s"])) for k, v in runs.items()}
    return {"steps": steps, "rounds": rounds, "disk": best["disk"], "stream": best["stream"],
            "rounds_tok_s": {k: [x["tok_s"] for x in v] for k, v in runs.items()},
            "ratio": round(best["stream"]["tok_s"] / best["disk"]["tok_s"], 3),
            "load": round(os.getloadavg()[0], 2)}


def capture_half(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """benchmarks/capture_engines.py's --producer measurement: vLLM's bare prefill, the executor
    capture into a data directory and `engine stream-capture`, on the same chats."""
    from benchmarks.capture_engines import measure_producer
    return measure_producer(args, work)


def main() -> int:
    from benchmarks.capture import add_demo_options
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_demo_options(ap, repeat=2)  # --demo; --repeat/--merge: the --capture half's chats
    ap.add_argument("--steps", type=int, default=40, help="training steps per side (default 40)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds per side; the fastest counts")
    ap.add_argument("--capture", action="store_true",
                    help="also the producer vs vLLM's bare prefill (needs a real vLLM)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="eagle3-bench-stream-") as tmp:
        work = Path(tmp)
        from benchmarks.capture import demo_workspace
        demo = demo_workspace(args.demo, work)
        try:
            res = measure(demo, work, args.steps, args.rounds)
        except RuntimeError as e:
            sys.exit(str(e))
        if args.capture:
            res["capture"] = capture_half(args, work)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"training on the demo, {res['steps']} steps, 1 trainer process; load {res['load']}")
    print(f"{'side':<8}{'tok/s':>10}{'timed steps':>13}{'wall s':>9}{'start s':>9}{'end s':>7}"
          "  rounds (tok/s)")
    for side in ("disk", "stream"):
        r = res[side]
        print(f"{side:<8}{r['tok_s']:>10.0f}{r['timed_steps']:>13}{r['wall_s']:>9.1f}"
              f"{r['before_steps_s']:>9.1f}{r['after_steps_s']:>7.1f}  "
              f"{', '.join(f'{x:.0f}' for x in res['rounds_tok_s'][side])}")
    s = res["stream"]
    print(f"stream / disk: {res['ratio']:.2f}x (goal >= 0.9); trainer waited "
          f"{s.get('wait_s', 0.0):.2f} s for the producer, read {s.get('read_s', 0.0):.2f} s, "
          f"acked {s.get('ack_s', 0.0):.2f} s over {s['steps']} steps")
    if args.capture:
        c = res["capture"]
        print(f"producer vs vLLM's bare prefill: {c['producer']['vs_bare']:.2f}x (goal >= 0.9; "
              f"{c['producer']['tok_s']:.0f} vs {c['bare_prefill']['tok_s']:.0f} tok/s); the "
              f"executor capture into a data directory: {c['executor']['vs_bare']:.2f}x")
    print(f"quiet-machine figure: {QUIET_COMMAND}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
