"""`python -m engine stream-master`: run a stream's store (a Mooncake master with its metadata
server) until stopped.

    python -m engine stream-master [--host 127.0.0.1] [--address-file F] [--lease-s S]

It starts the master on free ports of --host (engine/stream/master.py), says its address
(`HOST:RPC_PORT/METADATA_PORT`, what `stream-put --to` and `train --from-stream` take) in a log
event and in --address-file, and waits. A stop (SIGTERM, SIGINT, SIGHUP) stops the master it
started, and only that one; a master that exits by itself ends this command with an error.
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
    p.add_argument("--log", metavar="F", help="the master's own log (default: a temp file)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def run(args: argparse.Namespace, ev: Emitter) -> int:
    import contextlib
    import os
    import time
    from pathlib import Path

    from engine.errors import EngineError
    from engine.fileio import termination_raises, write_text
    from engine.stream.master import start_master

    if not args.lease_s > 0:
        raise EngineError(f"--lease-s {args.lease_s}: must be > 0")
    m = start_master(args.host, Path(args.log) if args.log else None, args.lease_s)
    stopped = "stopped"
    try:
        with termination_raises():
            ev.log(f"stream store at {m.address} (mooncake_master pid {m.pid}, log {m.log})")
            if args.address_file:
                write_text(args.address_file, f"{m.address}\n")
            try:
                while m.proc is not None and m.proc.poll() is None:
                    time.sleep(0.2)
            except KeyboardInterrupt:
                pass
            else:
                stopped = "exited"
    finally:
        m.stop()
        if args.address_file:
            with contextlib.suppress(OSError):
                os.unlink(args.address_file)
    if stopped == "exited":
        raise EngineError(f"mooncake_master at {m.address} exited by itself (code "
                          f"{m.proc.returncode if m.proc else '?'}; log {m.log})")
    ev.answer({"address": str(m.address), "pid": m.pid}, args.json,
              lambda d: f"stream store at {d['address']} stopped")
    return 0
