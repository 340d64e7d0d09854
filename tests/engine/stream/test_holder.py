"""The store's memory lent by a holder beside the master (engine/stream/holder.py): what a
client lending none puts lands there, over TCP on 127.0.0.1, and outlives that client killed
with SIGKILL."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from engine.stream.master import Master
from engine.stream.store import StoreClient
from tests.engine_helpers import REPO, engine_env
from tests.stream_store import store_count

pytest_plugins = ("tests.stream_store",)
pytestmark = pytest.mark.usefixtures("mooncake")

_PUT_AND_DIE = r"""
import os, signal, sys
import torch
from engine.stream.address import StreamAddress
from engine.stream.store import StoreClient
c = StoreClient(StreamAddress.parse(sys.argv[1]))
buf = c.buffer.ensure(1 << 20)
buf[:] = torch.arange(1 << 20, dtype=torch.int64).remainder(251).to(torch.uint8)
c.put_from("holder/big", 1 << 20)
c.put_bytes("holder/small", b"still here")
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_what_a_killed_client_put_stays_in_the_holders_memory(stream_master: Master) -> None:
    assert stream_master.holder is not None and stream_master.holder.alive()
    base = store_count(stream_master)
    p = subprocess.run([sys.executable, "-c", _PUT_AND_DIE, str(stream_master.address)],
                       cwd=REPO, env=engine_env(), capture_output=True, timeout=120)
    assert p.returncode == -9, p.stderr[-2000:]
    c = StoreClient(stream_master.address)
    try:
        assert c.get_bytes("holder/small") == b"still here"
        want = torch.arange(1 << 20, dtype=torch.int64).remainder(251).to(torch.uint8)
        assert torch.equal(c.get_into("holder/big"), want)
        assert store_count(stream_master) == base + 2
        c.remove(["holder/big", "holder/small"])
    finally:
        c.close()
    assert store_count(stream_master) == base
