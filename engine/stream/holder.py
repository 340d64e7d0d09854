"""The process that lends a stream's store its memory: Mooncake's `mooncake_client` with one
global segment, started beside the master and owned as the master is (PID and start time).

The objects a producer puts live in this segment, so a producer killed with SIGKILL loses
nothing it put: the producer and the trainer ranks are clients that lend no memory, and a
restarted producer finds its samples still there. The segment is reserved, not touched: the
memory is used as objects arrive. It must be larger than the producer's byte watermark with
room to spare: Mooncake starts evicting above 90% of it (`default_segment_bytes`).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from engine.ckpt.output_dir import process_start
from engine.errors import EngineError
from engine.stream.address import StreamAddress
from engine.stream.owned import accepts, free_port, mooncake_binary, stop_owned
from engine.stream.pool import default_high_bytes


def default_segment_bytes() -> int:
    """Room for a producer's default byte watermark (a quarter of the memory available) with
    a quarter on top and 64 MiB for the small keys: used at most 80%, below Mooncake's 90%."""
    return default_high_bytes() * 5 // 4 + (64 << 20)


@dataclass
class Holder:
    pid: int
    start: str | None
    segment_bytes: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        return self.proc.poll() is None if self.proc is not None else (
            self.start is not None and process_start(self.pid) == self.start)

    def stop(self, grace_s: float = 10.0) -> None:
        stop_owned(self.pid, self.start, self.proc, grace_s)


def holder_env(host: str) -> dict[str, str]:
    """The client environment of engine/stream/store.py, for a process of its own."""
    env = dict(os.environ)
    for k, v in (("MC_FORCE_TCP", "1"), ("MC_STORE_MEMCPY", "0"), ("MC_TCP_BIND_ADDRESS", host),
                 ("MC_LOG_LEVEL", "WARNING")):
        env.setdefault(k, v)
    return env


def start_holder(address: StreamAddress, segment_bytes: int, log: Path,
                 timeout_s: float = 30.0) -> Holder:
    """Start a holder of `segment_bytes` on the master's host; return once it has mounted its
    segment (its service port answers only after the mount)."""
    if segment_bytes < 16 << 20:
        raise EngineError(f"--segment-gb {segment_bytes / 2**30:g}: the store needs at least "
                          "16 MiB of memory")
    host = address.host
    port = free_port(host)
    argv = [mooncake_binary("mooncake_client"), f"--global_segment_size={segment_bytes}",
            f"--host={host}", f"--port={port}", f"--master_server_address={address.master}",
            f"--metadata_server={address.metadata_url}", "--protocol=tcp",
            "--local_buffer_size=0"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env=holder_env(host))
    h = Holder(proc.pid, process_start(proc.pid), segment_bytes, log, proc)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and proc.poll() is None:
        if accepts(host, port):
            return h
        time.sleep(0.05)
    h.stop()
    raise EngineError(f"mooncake_client (the store's memory, {segment_bytes / 2**30:.2f} GiB): "
                      f"{'exited' if proc.poll() is not None else 'not ready'} at start "
                      f"(log: {log})")
