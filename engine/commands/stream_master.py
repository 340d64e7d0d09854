"""`python -m engine stream-master`: run a stream's store (a Mooncake master with its metadata
server, and the holder that lends it memory) until stopped.

    python -m engine stream-master [--host 127.0.0.1] [--address-file F] [--segment-gb G]

It starts the master on free ports of --host (engine/stream/master.py) and a memory holder of
--segment-gb beside it (engine/stream/holder.py: the producer and the trainers lend none, so
what a producer put outlives it), says the address (`HOST:RPC_PORT/METADATA_PORT`, what
`stream-put --to` and `train --from-stream` take) in a log event and in --address-file, and
waits. A stop (SIGTERM, SIGINT, SIGHUP) stops the holder and the master it started, and only
those; either one exiting by itself ends this command with an error.
"""

from __future__ import annotations

import argparse

from engine.events import Emitter

HELP = "run a stream's store (Mooncake master + metadata server) until stopped"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (the producer and the trainers reach it there)")
    p.add_argument("--address-file", metavar="F", help="also write the address to this file")
    p.add_argument("--lease-s", type=float, default=3600.0, metavar="S",
                   help="objects' lease: longer than the slowest read of one sample")
    p.add_argument("--segment-gb", type=float, metavar="G",
                   help="the store's memory, lent by a holder process beside the master "
                        "(default: a quarter of the memory available plus a quarter, room for "
                        "stream-put's default --high-gb; keep it above --high-gb x 1.25)")
    p.add_argument("--put-discard-s", type=int, default=5, metavar="S",
                   help="an unfinished put (its producer killed mid-put) gives way to a new "
                        "put of the same key after S seconds")
    p.add_argument("--log", metavar="F", help="the master's own log, the holder's beside it "
                   "as holder.log (default: a temp folder)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def run(args: argparse.Namespace, ev: Emitter) -> int:
    import contextlib
    import os
    import time
    from pathlib import Path

    from engine.errors import EngineError
    from engine.fileio import termination_raises, write_text
    from engine.stream.holder import default_segment_bytes
    from engine.stream.master import start_master

    if not args.lease_s > 0:
        raise EngineError(f"--lease-s {args.lease_s}: must be > 0")
    if args.segment_gb is not None and not args.segment_gb > 0:
        raise EngineError(f"--segment-gb {args.segment_gb:g}: must be > 0")
    if not args.put_discard_s > 0:
        raise EngineError(f"--put-discard-s {args.put_discard_s}: must be > 0")
    segment = (int(args.segment_gb * 2**30) if args.segment_gb is not None
               else default_segment_bytes())
    m = start_master(args.host, Path(args.log) if args.log else None, args.lease_s,
                     segment_bytes=segment, put_discard_s=args.put_discard_s)
    holder = m.holder
    assert holder is not None
    stopped = "stopped"
    try:
        with termination_raises():
            ev.log(f"stream store at {m.address} (mooncake_master pid {m.pid}, log {m.log}; "
                   f"{segment / 2**30:.2f} GiB lent by mooncake_client pid {holder.pid})")
            if args.address_file:
                write_text(args.address_file, f"{m.address}\n")
            try:
                while m.proc is not None and m.proc.poll() is None and holder.alive():
                    time.sleep(0.2)
            except KeyboardInterrupt:
                pass
            else:  # one of the two exited by itself
                stopped = ("master" if m.proc is None or m.proc.poll() is not None
                           else "holder")
    finally:
        m.stop()
        if args.address_file:
            with contextlib.suppress(OSError):
                os.unlink(args.address_file)
    if stopped == "holder":
        raise EngineError(f"mooncake_client (the store's memory) exited by itself (code "
                          f"{holder.proc.returncode if holder.proc else '?'}; log {holder.log}):"
                          " what it held is lost")
    if stopped == "master":
        raise EngineError(f"mooncake_master at {m.address} exited by itself (code "
                          f"{m.proc.returncode if m.proc else '?'}; log {m.log})")
    ev.answer({"address": str(m.address), "pid": m.pid, "holder_pid": holder.pid,
               "segment_bytes": segment}, args.json,
              lambda d: f"stream store at {d['address']} stopped")
    return 0
