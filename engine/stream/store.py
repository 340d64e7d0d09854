"""One client of a Mooncake store, over TCP, as the producer and the trainer ranks use it.

Mooncake is imported here only, on first connect (the console and every other engine command
run without it). Over TCP it must be told so (`MC_FORCE_TCP`: on one node it would try RDMA),
`MC_STORE_MEMCPY=0` keeps it off a local-memcpy path that crashes under TCP, and
`MC_TCP_BIND_ADDRESS` keeps its listening sockets on the address the master reaches us at (a
loopback master: loopback only), and `MC_TCP_PROTO=1` makes our transfers use the TCP framing
without the per-transfer status frame: with the acknowledged framing (0.3.13.post1's default) a
put now and then waited for a status frame that never came, 30 s and then failed (error -704):
seen here on one machine in 2 of 3 runs of 270 puts, on old code and new, and in 0 of 6 with
the old framing. Each is set only when the user has not set it. Since Mooncake
0.3.12 a buffer that `put_from`/`get_into` uses must be registered even under TCP: `Buffer` is
one registered host buffer that grows (a new one registered, the old one unregistered) when a
larger object comes.

A client may contribute memory to the store (`segment_bytes`), but the producer and the
trainer contribute none: the store's memory is lent by its holder (engine/stream/holder.py), so
what a producer put outlives it. Every failure is one EngineError line naming the
store, the operation and the key.
"""

from __future__ import annotations

import os
import socket
import time
import zlib
from typing import Any

import torch
from torch import Tensor

from engine.errors import EngineError
from engine.stream.address import StreamAddress

NOT_FOUND = -704  # Mooncake's OBJECT_NOT_FOUND
NOT_READY = -703  # what get_size says of an object whose put is still under way (seen here)
NO_ROOM = -200  # Mooncake's NO_AVAILABLE_HANDLE: no segment with room for a put
_LOCAL_BUFFER = 16 << 20
_TORN = 1  # a small object read with an upsert's bytes mixed in (StoreClient.get_bytes)


def _mooncake(bind: str) -> Any:
    os.environ.setdefault("MC_FORCE_TCP", "1")
    os.environ.setdefault("MC_STORE_MEMCPY", "0")
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", bind)  # else it listens on the host's address
    os.environ.setdefault("MC_LOG_LEVEL", "WARNING")  # its warnings and errors reach stderr
    os.environ.setdefault("MC_TCP_PROTO", "1")  # no status frame to wait for (docstring)
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as e:
        raise EngineError(f"mooncake: not importable ({e}); install the stream extra: pip "
                          "install 'eagle3-console[stream]' (and, on Debian/Ubuntu, apt install "
                          "libibverbs1 librdmacm1 libnuma1 libnl-3-200 libnl-route-3-200)"
                          ) from None
    return MooncakeDistributedStore


def local_address(master_host: str) -> str:
    """The address the master's host reaches us at: loopback for a loopback master, else the
    source address of a route to it (no packet is sent)."""
    if master_host.startswith("127.") or master_host == "localhost":
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((master_host, 9))
            return str(s.getsockname()[0])
        except OSError:
            return socket.gethostname()


class Buffer:
    """A host buffer registered with one store client; `ensure(n)` grows it."""

    def __init__(self, client: StoreClient, nbytes: int = 1 << 20) -> None:
        self.client = client
        self.tensor = torch.empty(0, dtype=torch.uint8)
        self.ensure(nbytes)

    def ensure(self, nbytes: int) -> Tensor:
        if nbytes > self.tensor.numel():
            old = self.tensor
            new = torch.empty(max(nbytes, 2 * old.numel()), dtype=torch.uint8)
            self.client.check(self.client.store.register_buffer(new.data_ptr(), new.numel()),
                              "register_buffer", f"{new.numel()} bytes")
            if old.numel():
                self.client.store.unregister_buffer(old.data_ptr())
            self.tensor = new
        return self.tensor

    @property
    def ptr(self) -> int:
        return int(self.tensor.data_ptr())


class StoreClient:
    def __init__(self, address: StreamAddress, segment_bytes: int = 0) -> None:
        for port, what in ((address.rpc_port, "master"),
                           (address.metadata_port, "metadata server")):
            try:  # Mooncake's own connect retries for minutes: say it at once
                socket.create_connection((address.host, port), timeout=5).close()
            except OSError as e:
                raise EngineError(f"mooncake store {address}: its {what} does not answer on "
                                  f"{address.host}:{port} ({e.strerror or e}); is "
                                  "`engine stream-master` running there?") from None
        here = local_address(address.host)
        cls = _mooncake(here)
        self.address = address
        self.store = cls()
        rc = self.store.setup(here, address.metadata_url,
                              int(segment_bytes), _LOCAL_BUFFER, "tcp", "", address.master)
        if rc != 0:
            raise EngineError(f"mooncake store {address}: cannot connect (setup returned {rc}; "
                              "is the master running there?)")
        self.buffer = Buffer(self)

    def check(self, rc: int, op: str, key: str) -> int:
        if rc == NO_ROOM:
            raise EngineError(f"mooncake store {self.address}: {op} {key}: no memory in the store "
                              f"has room for it (error {rc}): its holder lends the memory "
                              "(`engine stream-master --segment-gb G`); is it running, and big "
                              "enough for the producer's --high-gb?")
        if rc < 0:
            raise EngineError(f"mooncake store {self.address}: {op} {key}: error {rc}")
        return rc

    # -- small objects (manifest, plan, progress, heartbeat): bytes with a checksum ----------
    def put_bytes(self, key: str, data: bytes) -> None:
        """Put `data` under `key`, replacing what was there (with its CRC-32 after it)."""
        self.check(self.store.upsert(key, data + zlib.crc32(data).to_bytes(4, "big")),
                   "upsert", key)

    def get_bytes(self, key: str, ready_s: float = 10.0, buffer: Buffer | None = None
                  ) -> bytes | None:
        """The object's bytes; None while there is none, also when another client removed it
        between its size and its read (a trainer removes the plan while the producer looks).
        A thread reading beside another passes its own registered `buffer`.

        Mooncake replaces an object in place: while another client's upsert is under way the
        object reads as not ready, or reads successfully with old and new bytes mixed. The
        trainer rewrites its progress after every step while the producer reads it, so such a
        read is made again until it is whole (its checksum holds), `ready_s` at most: then an
        upsert that never finished (its client killed) reads as none, and bytes that never
        check out are an error."""
        deadline = time.monotonic() + ready_s
        while True:
            got = self._read_small(key, self.buffer if buffer is None else buffer)
            if got is None or isinstance(got, bytes):
                return got
            if time.monotonic() > deadline:
                if got == NOT_READY:
                    return None
                raise EngineError(f"mooncake store {self.address}: {key}: its bytes do not "
                                  f"check out after {ready_s:g} s of reading (not written by "
                                  "this engine's put_bytes?)")
            time.sleep(0.002)

    def _read_small(self, key: str, into: Buffer) -> bytes | int | None:
        """One read of a small object: its data, None (absent), NOT_READY, or _TORN."""
        n = int(self.store.get_size(key))
        if n in (NOT_FOUND, NOT_READY):
            return None if n == NOT_FOUND else n
        size = self.check(n, "get_size", key)
        buf = into.ensure(size)
        got = int(self.store.get_into(key, into.ptr, size))
        if got in (NOT_FOUND, NOT_READY):
            return None if got == NOT_FOUND else got
        self.check(got, "get_into", key)
        raw = bytes(buf[:got].numpy())
        if got == size >= 4 and zlib.crc32(raw[:-4]).to_bytes(4, "big") == raw[-4:]:
            return raw[:-4]
        return _TORN

    # -- samples: registered buffers ---------------------------------------------------------
    def put_from(self, key: str, nbytes: int) -> None:
        """Put the first `nbytes` of `self.buffer` under `key` (a key that exists is kept)."""
        self.check(self.store.put_from(key, self.buffer.ptr, nbytes), "put_from", key)

    def get_into(self, key: str, buffer: Buffer | None = None) -> Tensor:
        """The object under `key`, read into `buffer` (default `self.buffer`; a view of it:
        copy to keep it). A thread reading beside another passes its own registered buffer."""
        into = self.buffer if buffer is None else buffer
        size = self.size(key)
        if size is None:
            raise EngineError(f"mooncake store {self.address}: {key}: no such object")
        buf = into.ensure(size)
        got = self.check(self.store.get_into(key, into.ptr, size), "get_into", key)
        if got != size:
            raise EngineError(f"mooncake store {self.address}: {key}: read {got} of {size} "
                              "bytes")
        return buf[:size]

    def size(self, key: str) -> int | None:
        """The object's size; None while there is none to read (absent, or its put unfinished)."""
        n = int(self.store.get_size(key))
        if n in (NOT_FOUND, NOT_READY):
            return None
        return self.check(n, "get_size", key)

    def pending(self, key: str) -> bool:
        """Whether a put of `key` is under way, or was left unfinished by a killed client."""
        return int(self.store.get_size(key)) == NOT_READY

    def exists(self, keys: list[str]) -> list[bool]:
        if not keys:
            return []
        got = self.store.batch_is_exist(keys)
        for k, rc in zip(keys, got, strict=True):
            self.check(int(rc), "is_exist", k)
        return [bool(rc) for rc in got]

    def remove(self, keys: list[str]) -> None:
        """Remove `keys` (forced: the lease protects readers we no longer have); a key that is
        already gone is fine."""
        if not keys:
            return
        for k, rc in zip(keys, self.store.batch_remove(keys, True), strict=True):
            if int(rc) not in (0, NOT_FOUND):
                self.check(int(rc), "remove", k)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None
