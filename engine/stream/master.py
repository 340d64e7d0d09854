"""A Mooncake master (with its HTTP metadata server) that this process starts and owns.

`start_master()` picks free ports on the host's address, starts `mooncake_master` in its own
session, waits until both its RPC port and its metadata port accept connections, and returns a
`Master`: its `StreamAddress`, its PID and the process's start time (`BOOT_ID:TICKS`, as
engine/ckpt/output_dir.py records owners). `stop()` signals only that process: a PID whose start
time differs is another program that got the number after ours exited, and is left alone.

Objects get a long lease (`lease_s`): a read of a multi-GB sample over TCP may take longer than
Mooncake's default 10 s, and an object whose lease expires mid-read can be evicted. Removal is
ours to decide (the trainer's ack removes with force), so the long lease costs nothing.

The store's memory is lent by a holder process started beside the master (`segment_bytes`,
engine/stream/holder.py), not by the producer: what a producer put outlives the producer.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from engine.ckpt.output_dir import process_start
from engine.errors import EngineError
from engine.stream.address import StreamAddress
from engine.stream.holder import Holder, start_holder
from engine.stream.owned import accepts, free_port, mooncake_binary, stop_owned

DEFAULT_LEASE_S = 3600.0
#: after this long, an unfinished put (its producer killed mid-put) gives way to a new put of
#: the same key; until then Mooncake answers such a put with success and keeps nothing
DEFAULT_PUT_DISCARD_S = 5


def master_binary() -> str:
    """`mooncake_master` (engine/stream/owned.py says where it is looked for)."""
    return mooncake_binary("mooncake_master")


@dataclass
class Master:
    address: StreamAddress
    pid: int
    start: str | None
    log: Path
    metrics_port: int | None = None
    proc: subprocess.Popen[bytes] | None = None
    temp_dir: Path | None = None  # ours to remove once the master is gone (a default log's)
    holder: Holder | None = None  # the process lending the store its memory (holder.py)

    @property
    def metrics_url(self) -> str | None:
        """Its Prometheus page (`master_key_count`: the objects in the store)."""
        return (f"http://{self.address.host}:{self.metrics_port}/metrics"
                if self.metrics_port else None)

    def ours(self) -> bool:
        """Whether `pid` is still the process we started (same start time)."""
        return self.start is not None and process_start(self.pid) == self.start

    def stop(self, grace_s: float = 10.0) -> None:
        """TERM, then KILL after `grace_s`; only while the PID is still ours. The memory holder
        goes first (its objects with it), then the master. A default log goes with a master we
        stopped; one that exited by itself keeps it (it says why)."""
        if self.holder is not None:
            self.holder.stop(grace_s)
        stopped = stop_owned(self.pid, self.start, self.proc, grace_s)
        if stopped and self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> Master:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_master(host: str = "127.0.0.1", log: Path | None = None,
                 lease_s: float = DEFAULT_LEASE_S, timeout_s: float = 30.0,
                 tries: int = 3, segment_bytes: int = 0,
                 put_discard_s: int = DEFAULT_PUT_DISCARD_S) -> Master:
    """Start a master on free ports of `host` (module docstring); a port taken between our
    probe and the master's bind is retried with new ports. With `segment_bytes`, a memory
    holder (engine/stream/holder.py) lends the store that much memory, started beside it."""
    m = _start_master(host, log, lease_s, timeout_s, tries, put_discard_s)
    if segment_bytes:
        try:
            m.holder = start_holder(m.address, segment_bytes, m.log.with_name("holder.log"),
                                    timeout_s)
        except BaseException:
            m.stop()
            raise
    return m


def _start_master(host: str, log: Path | None, lease_s: float, timeout_s: float, tries: int,
                  put_discard_s: int) -> Master:
    binary = master_binary()
    temp_dir = None
    if log is None:
        import tempfile
        temp_dir = Path(tempfile.mkdtemp(prefix="eagle3-mooncake-"))
        log = temp_dir / "master.log"
    last = ""
    for _ in range(tries):
        rpc, meta, metrics = free_port(host), free_port(host), free_port(host)
        argv = [binary, f"--rpc_address={host}", f"--rpc_port={rpc}",
                "--enable_http_metadata_server=true", f"--http_metadata_server_host={host}",
                f"--http_metadata_server_port={meta}", f"--metrics_port={metrics}",
                f"--default_kv_lease_ttl={int(lease_s * 1000)}",
                f"--put_start_discard_timeout_sec={put_discard_s}"]
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        m = Master(StreamAddress(host, rpc, meta), proc.pid, process_start(proc.pid), log,
                   metrics, proc, temp_dir)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and proc.poll() is None:
            if accepts(host, rpc) and accepts(host, meta):
                return m
            time.sleep(0.05)
        if proc.poll() is None:
            m.stop()
            raise EngineError(f"mooncake_master: not listening on {m.address} after "
                              f"{timeout_s:.0f} s (log: {log})")
        last = _tail(log)
    raise EngineError(f"mooncake_master: exited at start ({last or 'no output'}; log: {log})")


def _tail(log: Path) -> str:
    try:
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""
