"""Benchmark: features through a vLLM-style server vs the transformers path, on the demo target.

    python benchmarks/capture.py [--demo DIR] [--repeat 3] [--merge 6] [--steps 40] [--rounds 3]
                                 [--json]

(a) capture throughput (tokens/s) of `prepare` (the target loaded here, batched forwards, shards
    written) against `prepare --from-vllm` through the stand-in vLLM server
    (tests/vllm_standin.py, a separate process running the same target with continuous batching:
    HTTP requests, the connector's files under flock, final norm, shards written, server files
    deleted). Tokenisation and model loading are excluded from both (the manifests' `seconds`).
    Goal: from-vllm >= 0.9 x transformers, i.e. the client adds < 10% over computing features.
(b) trainer tokens/s on the demo preset, offline (features read from the shards) against
    streamed (`train --online --from-vllm`: features fetched from the stand-in with prefetch),
    on the conversations of (a), prepared once for the offline side.
    Goal: streamed >= 0.9 x offline while the server keeps up. Measured twice: against the live
    stand-in (its forwards share this machine's cores with the trainer), and against the stand-in
    with a warm cache (every sample's features computed before timing; an answer is HTTP and the
    file write only), which isolates the client's cost as on a GPU host that keeps up.
Capture runs on the demo's train.jsonl chats joined `--merge` at a time into multi-turn
conversations (~370 tokens; real samples are long) and repeated `--repeat` times; training on
the same conversations. Without --demo, a demo workspace is built in a temporary directory
first (~20 s).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from engine.events import Emitter  # noqa: E402


def quiet() -> Emitter:
    return Emitter("bench", out=io.StringIO(), err=io.StringIO())


class Server:
    """The stand-in vLLM server in its own process (own interpreter: no GIL shared with us)."""

    def __init__(self, target: Path, storage: Path, threads: int, cached: bool = False) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO), TOKENIZERS_PARALLELISM="false")
        self.storage = str(storage)  # the clients read and delete files there only
        cmd = [str(Path(__file__).resolve()), "--serve-cached"] if cached else \
            ["-m", "tests.vllm_standin"]
        self.proc = subprocess.Popen(
            [sys.executable, *cmd, "--target", str(target), "--storage",
             str(storage), "--threads", str(threads)], cwd=REPO, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://"):
            raise RuntimeError("the stand-in server did not start")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def serve_cached(target: str, storage: str, threads: int) -> int:
    """The stand-in, answering a prompt it has seen from its features computed then (a warm
    cache: each answer is only HTTP and the file write), so the trainer's figure measures the
    client's cost, not a server that shares the trainer's cores with its own compute."""
    import time

    from tests.vllm_standin import VllmStandin

    class Cached(VllmStandin):
        cache: dict[tuple[int, ...], torch.Tensor] = {}

        def _features(self, seqs: list[list[int]]) -> list[torch.Tensor]:
            miss = [s for s in seqs if tuple(s) not in self.cache]
            if miss:
                for s, hs in zip(miss, super()._features(miss), strict=True):
                    self.cache[tuple(s)] = hs
            return [self.cache[tuple(s)] for s in seqs]

    s = Cached(target, storage, threads=threads)
    print(s.url, flush=True)
    while True:
        time.sleep(3600)


def warm_up(demo: Path, conv: Path, url: str, storage: str) -> None:
    """Every training sample asked once, before timing (fills the cached server)."""
    from engine.capture.online_data import VllmStreamData
    d = VllmStreamData(str(conv), str(demo / "target"), url, 512, server_storage=storage)
    try:
        d.batch(tuple(range(len(d.lengths))))
    finally:
        d.close()


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median tokens/s (upper median for an even count)."""
    return sorted(runs, key=lambda m: m["tokens_per_s"])[len(runs) // 2]


def long_conversations(src: Path, dst: Path, times: int, merge: int) -> Path:
    """The demo chats, `merge` at a time joined into one multi-turn conversation (real samples are
    long: per-request costs spread over more tokens), the whole set `times` over with new ids."""
    lines = [json.loads(x) for x in src.read_text().splitlines() if x.strip()]
    with open(dst, "w", encoding="utf-8") as f:
        for r in range(times):
            for k in range(0, len(lines), merge):
                group = lines[k:k + merge]
                turns = [t for obj in group for t in obj["conversations"]]
                f.write(json.dumps({"id": f"{group[0]['id']}-x{merge}-r{r}",
                                    "conversations": turns}) + "\n")
    return dst


def add_demo_options(ap: argparse.ArgumentParser, repeat: int) -> None:
    """--demo, --repeat and --merge: what `demo_and_conversations` reads."""
    ap.add_argument("--demo", help="existing demo workspace (default: build one)")
    ap.add_argument("--repeat", type=int, default=repeat,
                    help=f"copies of the demo conversations (default {repeat})")
    ap.add_argument("--merge", type=int, default=6,
                    help="demo chats joined per captured conversation (default 6)")


def demo_workspace(given: str | None, work: Path) -> Path:
    """The demo workspace `given` (--demo), else one built in `work` (about a minute)."""
    if given:
        return Path(given)
    from engine.demo.workspace import init_demo
    demo = work / "demo"
    init_demo(str(demo), quiet())
    return demo


def demo_and_conversations(args: argparse.Namespace, work: Path) -> tuple[Path, Path]:
    """The demo workspace (`--demo`, or built in `work`) and its long conversations
    (`--repeat`, `--merge`) in `work`."""
    demo = demo_workspace(args.demo, work)
    return demo, long_conversations(demo / "conversations" / "train.jsonl",
                                    work / "conv.jsonl", args.repeat, args.merge)


def bench_capture(demo: Path, conv: Path, work: Path, url: str, storage: str, rounds: int = 3
                  ) -> dict[str, Any]:
    from engine.capture.vllm_capture import prepare_from_vllm
    from engine.data.prepare import prepare
    from engine.data.target import Target
    target = Target.load(str(demo / "target"), device="cpu")
    hf, vl = [], []
    tokens = 0
    for r in range(rounds):  # alternate, so load changes on a shared machine hit both
        out = work / f"hf{r}"
        m = prepare(str(demo / "target"), str(conv), str(out), max_len=512, target=target)
        hf.append(float(m["seconds"]))
        tokens = int(m["tokens"])
        shutil.rmtree(out)
        out = work / f"vllm{r}"
        m = prepare_from_vllm(str(demo / "target"), str(conv), str(out), url, max_len=512,
                              concurrency=16, ev=quiet(), server_storage=storage)
        vl.append(float(m["seconds"]))
        shutil.rmtree(out)
    h, v = min(hf), min(vl)
    return {"tokens": tokens, "transformers_s": round(h, 3), "from_vllm_s": round(v, 3),
            "transformers_tok_s": round(tokens / h), "from_vllm_tok_s": round(tokens / v),
            "ratio": round(h / v, 3)}


def bench_train(demo: Path, data: Path, work: Path, steps: int, url: str | None,
                storage: str = "") -> dict[str, Any]:
    """Demo-preset training for `steps` steps: offline on the prepared directory `data`, or
    streamed from the server at `url` with `data` the conversations JSONL."""
    from engine.demo.workspace import DRAFT_VOCAB, TRAIN_ARGS
    from engine.training.config import TrainConfig
    from engine.training.train import train
    args = dict(zip(TRAIN_ARGS[::2], TRAIN_ARGS[1::2], strict=True))
    out = work / ("streamed" if url else "offline")
    cfg = TrainConfig(target=str(demo / "target"), data=str(data),
                      out=str(out), draft_vocab_size=DRAFT_VOCAB, max_steps=steps,
                      lr=float(args["--lr"]), batch_tokens=int(args["--batch-tokens"]),
                      ttt_steps=int(args["--ttt-steps"]), epochs=40, save_every=0, holdout=0,
                      online=url is not None, from_vllm=url, max_len=512,
                      **({"server_storage": storage} if storage else {}))
    ev = quiet()
    try:
        train(cfg, ev)
    finally:
        ev.close()
    lines = (out / "events.jsonl").read_text().splitlines()
    metrics = [json.loads(line)["values"] for line in lines if '"kind":"metric"' in line]
    metrics = metrics[min(5, len(metrics) // 4):]  # skip warm-up steps
    step_s = sum(m["step_time_s"] for m in metrics)
    wait = sum(m.get("t_target_s", 0.0) + m.get("t_data_s", 0.0) for m in metrics)
    shutil.rmtree(out)
    return {"steps": len(metrics), "tokens_per_s": round(sum(m["tokens"] for m in metrics)
                                                         / step_s),
            "step_ms": round(1000 * step_s / len(metrics), 1),
            "data_share": round(wait / step_s, 3)}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_demo_options(ap, repeat=3)
    ap.add_argument("--steps", type=int, default=40, help="training steps per mode")
    ap.add_argument("--rounds", type=int, default=3,
                    help="offline / warm-streamed training pairs, alternated (default 3)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--serve-cached", action="store_true", help=argparse.SUPPRESS)  # internal
    ap.add_argument("--target", help=argparse.SUPPRESS)
    ap.add_argument("--storage", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    return ap.parse_args()


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """(a) and (b) in `work`: the demo (given or built), its long conversations, then the live
    stand-in's measurements and the warm one's."""
    demo, conv = demo_and_conversations(args, work)
    threads = torch.get_num_threads()
    # Same compute on both sides of each ratio: the features are computed with `st` threads
    # here or in the server, and the trainer keeps the other core(s) in both modes (on a GPU
    # host the server has GPUs of its own). Two processes whose OpenMP teams both want every
    # core spin against each other.
    st = max(1, threads - 1)
    res: dict[str, Any] = {"threads": threads, "server_threads": st}
    prepared, offline = bench_live(demo, conv, work, args.steps, res)
    bench_warm(demo, conv, prepared, work, args, offline, res)
    return res


def bench_live(demo: Path, conv: Path, work: Path, steps: int, res: dict[str, Any]
               ) -> tuple[Path, list[dict[str, Any]]]:
    """Against the live stand-in: capture (a), then the trainer offline once and streamed (b).
    Fills `res`; returns the prepared directory and the offline run."""
    threads, st = res["threads"], res["server_threads"]
    server = Server(demo / "target", work / "hs", st)
    try:
        torch.set_num_threads(st)
        res["capture"] = bench_capture(demo, conv, work, server.url, server.storage)
        torch.set_num_threads(max(1, threads - st))
        res["trainer_threads"] = torch.get_num_threads()
        # (b) trains on the same long conversations as (a), offline from their prepared
        # directory: per-sample costs (a request, a file) spread over realistic lengths
        from engine.data.prepare import prepare
        prepared = work / "prepared"
        prepare(str(demo / "target"), str(conv), str(prepared), max_len=512, ev=quiet())
        offline = [bench_train(demo, prepared, work, steps, None)]
        res["train_streamed"] = bench_train(demo, conv, work, steps, server.url, server.storage)
    finally:
        server.close()
    return prepared, offline


def bench_warm(demo: Path, conv: Path, prepared: Path, work: Path, args: argparse.Namespace,
               offline: list[dict[str, Any]], res: dict[str, Any]) -> None:
    """Against the stand-in with a warm cache: `args.rounds` offline / streamed pairs (the
    first offline run is the live phase's). Fills `res`."""
    server = Server(demo / "target", work / "hs-cached", res["server_threads"], cached=True)
    try:
        warm_up(demo, conv, server.url, server.storage)
        # offline and warm streamed alternate, so a shared machine's load hits both; medians
        cached = []
        for r in range(args.rounds):
            if r:
                offline.append(bench_train(demo, prepared, work, args.steps, None))
            cached.append(bench_train(demo, conv, work, args.steps, server.url, server.storage))
    finally:
        server.close()
    res["train_offline"] = median_run(offline)
    res["train_streamed_cached"] = median_run(cached)
    res["cached_ratios"] = [round(c["tokens_per_s"] / o["tokens_per_s"], 3)
                            for o, c in zip(offline, cached, strict=True)]


def print_report(res: dict[str, Any]) -> None:
    c = res["capture"]
    print(f"(a) capture, {c['tokens']} tokens, demo target; features computed with "
          f"{res['server_threads']} thread(s) on both paths, {res['threads']} core(s)")
    print(f"    transformers path  {c['transformers_tok_s']:>9} tok/s   "
          f"({c['transformers_s']:.3f}s)")
    print(f"    --from-vllm        {c['from_vllm_tok_s']:>9} tok/s   ({c['from_vllm_s']:.3f}s)   "
          f"ratio {c['ratio']:.2f}x (goal >= 0.9x)")
    off, on, wc = res["train_offline"], res["train_streamed"], res["train_streamed_cached"]
    print(f"(b) training, demo preset, trainer {res['trainer_threads']} thread(s)  offline"
          "    streamed  streamed, server cache warm")
    print(f"    tokens/s                   {off['tokens_per_s']:>10} {on['tokens_per_s']:>11} "
          f"{wc['tokens_per_s']:>11}")
    r_on = on["tokens_per_s"] / off["tokens_per_s"]
    r_wc = statistics.median(res["cached_ratios"])
    print(f"    ratio to offline           {1:>10.2f} {r_on:>11.2f} {r_wc:>11.2f}   "
          "(goal >= 0.9x)")
    print(f"    step (ms)                  {off['step_ms']:>10} {on['step_ms']:>11} "
          f"{wc['step_ms']:>11}")
    print(f"    share waiting for features {off['data_share'] * 100:>9.1f}% "
          f"{on['data_share'] * 100:>10.1f}% {wc['data_share'] * 100:>10.1f}%")
    print("    (live: the stand-in computes features on the trainer's 2 cores; warm: it answers "
          "from features computed before timing, so the figure is the client's cost)")
    print(f"    offline and warm alternated {len(res['cached_ratios'])} times: medians; "
          f"warm/offline per round {', '.join(f'{x:.2f}' for x in res['cached_ratios'])}")


def main() -> int:
    args = parse_args()
    if args.serve_cached:
        torch.set_num_threads(args.threads)
        return serve_cached(args.target, args.storage, args.threads)
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    work = Path(tempfile.mkdtemp(prefix="eagle3-bench-capture-"))
    try:
        res = measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print_report(res)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
