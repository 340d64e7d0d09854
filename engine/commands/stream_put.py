"""`python -m engine stream-put`: stream a prepared data directory into a stream run's store.

    python -m engine stream-put --data DIR --to HOST:RPC/META --run NAME [--high-samples N ...]

The producer of engine/stream/producer.py over a data directory: it puts the run's manifest,
waits for the trainer's plan (`train --from-stream ADDR --data NAME`), puts the samples in that
order within the pool's watermarks, and exits once the trainer has taken them all. Killed and
started again with the same command, it goes on where it was: what it put is still in the store
(the memory is stream-master's), and it skips what the trainer has already trained on.
"""

from __future__ import annotations

import argparse

from engine.events import Emitter

HELP = "stream a prepared data directory into a store for `train --from-stream`"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="prepared data directory (manifest.json + shards)")
    p.add_argument("--to", required=True, metavar="ADDR",
                   help="the store's master: HOST:RPC_PORT/METADATA_PORT")
    p.add_argument("--run", required=True, help="the stream run's name (train's --data)")
    add_pool_options(p)
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def add_pool_options(p: argparse.ArgumentParser) -> None:
    """The pool's watermarks and the wait for a trainer: every producer's flags."""
    p.add_argument("--high-samples", type=int, metavar="N",
                   help="pause above this many samples in flight (default 256)")
    p.add_argument("--low-samples", type=int, metavar="N",
                   help="resume at or below this many (default 192, or 3/4 of --high-samples)")
    p.add_argument("--high-gb", type=float, metavar="GB",
                   help="pause above this many GiB in flight (default a quarter of the memory "
                        "available)")
    p.add_argument("--low-gb", type=float, metavar="GB",
                   help="resume at or below this many GiB (default 3/4 of --high-gb)")
    p.add_argument("--plan-timeout", type=float, metavar="S",
                   help="give up when no trainer asked for samples within S seconds")


def run(args: argparse.Namespace, ev: Emitter) -> int:
    import os

    from engine.data.readers import open_data
    from engine.fileio import sha256_file
    from engine.stream.address import StreamAddress
    from engine.stream.pool import Watermarks
    from engine.stream.producer import produce_data
    from engine.stream.store import StoreClient

    address = StreamAddress.parse(args.to, "--to")
    marks = Watermarks.make(args.high_samples, args.low_samples, args.high_gb, args.low_gb)
    data = open_data(args.data)
    mpath = os.path.join(args.data, "manifest.json")
    digest = sha256_file(mpath) if os.path.isfile(mpath) else None
    dtype = str(data[0].hidden.dtype).removeprefix("torch.")
    data.meta = {**data.meta, "pool": {"high_samples": marks.high_samples,
                                       "high_bytes": marks.high_bytes}}
    # lends no memory: the objects live in the store's holder (stream-master), so they
    # outlive this process and a producer started again finds them
    client = StoreClient(address)
    try:
        got = produce_data(data, client, args.run, marks, ev, dtype, digest,
                           args.plan_timeout)
    finally:
        client.close()
    out = {"run": args.run, "samples": got.samples, "bytes": got.bytes, "put_s": got.put_s,
           "paused_s": got.paused_s, "pauses": got.pauses, "peak_in_flight": got.peak}
    ev.answer(out, args.json, lambda d: (
        f"streamed {d['samples']} samples ({d['bytes'] / 2**20:.1f} MiB) to run {d['run']}; "
        f"paused {d['pauses']} times, {d['paused_s']:.1f} s; at most {d['peak_in_flight']} in "
        "flight"))
    return 0
