"""Benchmark: samples' features through the `--from-vllm` path's transport vs a Mooncake store.

    python benchmarks/stream_transport.py [--demo DIR] [--count 320] [--hidden H] [--dtype D]
                                          [--concurrency 16] [--rounds 2] [--json]

The same samples' bytes (the lengths of the demo data's first `--count` samples; [T, 4, H]
states in `--dtype`, by default the demo's own size: H 64, float32) moved from a producer
process to this one, each way as the engine does it, the features already computed:
  files   the connector path: an HTTP server in its own process answering each
          `POST /v1/completions` as vLLM's ExampleHiddenStatesConnector does (tests/
          vllm_standin.py, its features made up instead of computed: every answer is the
          HTTP exchange and the safetensors file written under its flock); here the client
          of `prepare --from-vllm` (engine/capture/vllm_client.py: request, shared-flock read,
          checks, final norm, delete) with `--concurrency` requests in flight
  store   a `mooncake_master` on 127.0.0.1, a producer process putting each sample as one
          object (engine/stream/codec.py, a registered buffer, `put_from` over loopback TCP)
          and this process reading each as it appears (`get_into`, decode with its checks),
          removing it after
Each figure is wall time from the first request (or the producer's go) to the last sample in
hand, the fastest of `--rounds`; MB/s counts the states' bytes. Both producers run while the
reader runs: on one node they share its cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

LAYERS = 4  # three aux states and the final one: what the connector's file holds per token
RUN = "transport"


def lengths_of(demo: Path, count: int) -> list[int]:
    from engine.data.readers import open_data
    data = open_data(str(demo / "data"))
    got = [int(x) for x in data.lengths[:count]]
    if len(got) < count:
        sys.exit(f"{demo}/data holds {len(got)} samples, fewer than --count {count}")
    return got


def made_up(t: int, hidden: int, dtype: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t, LAYERS, hidden, generator=g).to(getattr(torch, dtype))


# -- the connector's files --------------------------------------------------------------------

def serve(target: str, storage: str, hidden: int, dtype: str) -> int:
    """(The server process.) The stand-in answering with made-up states of this size."""
    from tests.vllm_standin import VllmStandin

    class MadeUp(VllmStandin):
        def _features(self, seqs: list[list[int]]) -> list[torch.Tensor]:
            return [made_up(len(s), hidden, dtype, len(s)) for s in seqs]

    s = MadeUp(target, storage, threads=1)
    print(s.url, flush=True)
    while True:
        time.sleep(3600)


def files(demo: Path, work: Path, lengths: list[int], args: argparse.Namespace
          ) -> list[float]:
    import dataclasses

    from engine.capture.vllm_client import FeatureSpec, ServerStorage, VllmClient, read_features
    from engine.ckpt.final_norm import FinalNorm
    from engine.data.target import default_aux_ids, read_config
    target = str(demo / "target")
    cfg = read_config(target)
    spec = FeatureSpec.for_target(target, cfg, default_aux_ids(int(cfg["num_hidden_layers"])))
    spec = dataclasses.replace(spec, hidden_size=args.hidden,
                               norm=FinalNorm(torch.ones(args.hidden), 1e-6))
    storage = work / "hs"
    proc = subprocess.Popen([sys.executable, __file__, "--serve", target, str(storage),
                             "--hidden", str(args.hidden), "--dtype", args.dtype], cwd=REPO,
                            env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        client = VllmClient(url, storage=ServerStorage(str(storage)))
        client.served_model()
        prompts = [[1 + (i + k) % 50 for k in range(t)] for i, t in enumerate(lengths)]

        def one(i: int) -> int:
            path = client.request(str(i), prompts[i])
            aux, hidden = read_features(path, str(i), prompts[i], spec)
            client.storage.remove(path)
            return int(aux.shape[0])

        out = []
        with ThreadPoolExecutor(args.concurrency) as pool:
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                assert sum(pool.map(one, range(len(lengths)))) == sum(lengths)
                out.append(time.perf_counter() - t0)
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# -- the store --------------------------------------------------------------------------------

def sample_spec(t: int, args: argparse.Namespace) -> Any:
    from engine.stream.codec import SampleSpec
    return SampleSpec(t, args.hidden, args.dtype, False)


def put(address: str, lengths: list[int], args: argparse.Namespace, round_: int) -> int:
    """(The producer process.) Wait for the reader's go, put every sample, stay until all are
    removed (this client's memory holds them)."""
    from engine.data.features import Sample
    from engine.stream.address import StreamAddress
    from engine.stream.codec import encode, encoded_size
    from engine.stream.store import StoreClient
    specs = [sample_spec(t, args) for t in lengths]
    total = sum(encoded_size(s) for s in specs)
    client = StoreClient(StreamAddress.parse(address), segment_bytes=total * 5 // 4 + (64 << 20))
    samples = []
    for t in lengths:
        hs = made_up(t, args.hidden, args.dtype, t)
        samples.append(Sample(torch.arange(t) % 50, torch.ones(t, dtype=torch.long),
                              hs[:, :3].reshape(t, 3 * args.hidden), hs[:, 3], None))
    keys = [f"{RUN}/s/{round_}.{i}" for i in range(len(lengths))]
    client.buffer.ensure(max(encoded_size(s) for s in specs))
    print("ready", flush=True)
    while client.size(f"{RUN}/go{round_}") is None:
        time.sleep(0.001)
    for key, s, spec in zip(keys, samples, specs, strict=True):
        client.put_from(key, encode(s, spec, client.buffer.tensor))
    while any(client.exists(keys)):
        time.sleep(0.01)
    client.close()
    return 0


def store(lengths: list[int], work: Path, args: argparse.Namespace) -> list[float]:
    from engine.stream.codec import decode
    from engine.stream.master import start_master
    from engine.stream.store import StoreClient
    out = []
    with start_master("127.0.0.1", log=work / "master.log") as m:
        reader = StoreClient(m.address, 0)
        try:
            for r in range(args.rounds):
                prod = subprocess.Popen(
                    [sys.executable, __file__, "--put", str(m.address), "--round", str(r),
                     "--lengths", json.dumps(lengths), "--hidden", str(args.hidden),
                     "--dtype", args.dtype], cwd=REPO, stdout=subprocess.PIPE, text=True,
                    env=dict(os.environ, PYTHONPATH=str(REPO)))
                assert prod.stdout is not None and prod.stdout.readline().strip() == "ready"
                t0 = time.perf_counter()
                reader.put_bytes(f"{RUN}/go{r}", b"go")
                tokens = 0
                for i, t in enumerate(lengths):
                    key = f"{RUN}/s/{r}.{i}"
                    while reader.size(key) is None:
                        time.sleep(0.0005)
                    tokens += int(decode(reader.get_into(key), sample_spec(t, args),
                                         key).aux.shape[0])
                    reader.remove([key])
                out.append(time.perf_counter() - t0)
                assert tokens == sum(lengths) and prod.wait(timeout=60) == 0
                reader.remove([f"{RUN}/go{r}"])
        finally:
            reader.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--demo", help="an existing demo workspace (default: build one)")
    ap.add_argument("--count", type=int, default=320, help="samples moved (default 320)")
    ap.add_argument("--hidden", type=int, default=64, help="state width (default: the demo's)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--concurrency", type=int, default=16,
                    help="requests in flight on the files side (prepare's default)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)  # internal: TARGET STORAGE
    ap.add_argument("--put", help=argparse.SUPPRESS)  # internal: the store's address
    ap.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--lengths", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(*args.serve, args.hidden, args.dtype)
    if args.put:
        return put(args.put, json.loads(args.lengths), args, args.round)
    with tempfile.TemporaryDirectory(prefix="eagle3-bench-transport-") as tmp:
        work = Path(tmp)
        from benchmarks.capture import demo_workspace
        demo = demo_workspace(args.demo, work)
        lengths = lengths_of(demo, args.count)
        res: dict[str, Any] = {"samples": len(lengths), "tokens": sum(lengths),
                               "hidden": args.hidden, "dtype": args.dtype,
                               "concurrency": args.concurrency}
        res["mb"] = round(sum(lengths) * LAYERS * args.hidden
                          * getattr(torch, args.dtype).itemsize / 1e6, 2)
        res["files_s"] = [round(x, 3) for x in files(demo, work, lengths, args)]
        res["store_s"] = [round(x, 3) for x in store(lengths, work, args)]
    f, s = min(res["files_s"]), min(res["store_s"])
    res.update(files_mb_s=round(res["mb"] / f, 1), store_mb_s=round(res["mb"] / s, 1),
               files_samples_s=round(len(lengths) / f, 1),
               store_samples_s=round(len(lengths) / s, 1), store_vs_files=round(f / s, 3),
               load=round(os.getloadavg()[0], 2))
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"{res['samples']} samples, {res['tokens']} tokens, [T, {LAYERS}, {args.hidden}] "
          f"{args.dtype}: {res['mb']} MB of states; load {res['load']}")
    for side in ("files", "store"):
        print(f"{side:<6}{min(res[side + '_s']):>8.3f} s {res[side + '_mb_s']:>9.1f} MB/s "
              f"{res[side + '_samples_s']:>9.1f} samples/s   rounds "
              f"{', '.join(f'{x:.3f}' for x in res[side + '_s'])}")
    print(f"store / files: {res['store_vs_files']:.2f}x the speed")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
