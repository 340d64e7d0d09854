"""engine/stream/store.py against a real Mooncake master on 127.0.0.1: a small object removed
by another client between its size and its read is absent, not an error (the trainer removes
the run's plan when it is done while the producer still looks at it)."""

from __future__ import annotations

from typing import Any

import pytest

from engine.stream.master import Master
from engine.stream.store import StoreClient

pytest_plugins = ("tests.stream_store",)
pytestmark = pytest.mark.usefixtures("mooncake")


class RemovedAfterSize:
    """Mooncake's store with the other client's remove landing right after `get_size`."""

    def __init__(self, store: Any, other: StoreClient) -> None:
        self.store, self.other = store, other

    def get_size(self, key: str) -> int:
        n = self.store.get_size(key)
        self.other.remove([key])
        return int(n)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_an_object_removed_between_size_and_read_is_absent(stream_master: Master) -> None:
    owner = StoreClient(stream_master.address, segment_bytes=16 << 20)
    reader = StoreClient(stream_master.address, 0)
    try:
        owner.put_bytes("race/plan", b"x" * 1000)
        assert reader.get_bytes("race/plan") == b"x" * 1000
        reader.store = RemovedAfterSize(reader.store, owner)
        assert reader.get_bytes("race/plan") is None
    finally:
        reader.close()
        owner.close()


def test_a_store_without_memory_says_so_by_name() -> None:
    """A master started without its holder: a put has nowhere to go, and the error says that the
    holder lends the memory and how to start it, instead of Mooncake's bare code."""
    from engine.errors import EngineError
    from engine.stream.master import start_master
    with start_master("127.0.0.1") as m:
        c = StoreClient(m.address)
        try:
            with pytest.raises(EngineError, match=r"run/manifest: no memory in the store has room "
                               r"for it \(error -200\).*engine stream-master --segment-gb G"):
                c.put_bytes("run/manifest", b"{}")
        finally:
            c.close()


def test_an_object_read_while_another_client_replaces_it_is_read_whole(
        stream_master: Master) -> None:
    """The producer reads the trainer's progress while the trainer rewrites it after a step:
    Mooncake reads an object under an upsert as not ready, and that read is neither an error
    nor "no object": it is the old bytes or the new, whole."""
    import threading
    writer = StoreClient(stream_master.address, 0)
    reader = StoreClient(stream_master.address, 0)
    payloads = [bytes([c]) * (1 << 20) for c in b"ab"]
    stop = threading.Event()
    upserts = 0

    def rewrite() -> None:
        nonlocal upserts
        while not stop.is_set():
            writer.put_bytes("race/ack", payloads[upserts % 2])
            upserts += 1

    writer.put_bytes("race/ack", payloads[1])
    t = threading.Thread(target=rewrite, daemon=True)
    t.start()
    try:
        got = [reader.get_bytes("race/ack") for _ in range(100)]
    finally:
        stop.set()
        t.join()
        writer.remove(["race/ack"])
        reader.close()
        writer.close()
    assert upserts > 20
    assert all(g in payloads for g in got), sorted({g[:1] if g else g for g in got})
