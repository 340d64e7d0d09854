"""The producer against a real Mooncake master on 127.0.0.1: a put over the unfinished put of
a producer killed mid-put is tried again until it is kept."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
import torch

from engine.data.features import Sample
from engine.events import Emitter
from engine.stream import codec
from engine.stream.master import Master
from engine.stream.pool import Watermarks
from engine.stream.producer import Producer
from engine.stream.store import NOT_FOUND, NOT_READY, StoreClient
from tests.engine_helpers import REPO, engine_env
from tests.waiting import wait_until

pytest_plugins = ("tests.stream_store",)
pytestmark = pytest.mark.usefixtures("mooncake")

T, H = 1000, 9000  # a 144 MB sample: its put takes long enough to be killed in the middle
KEY = "swallow/s/0.0"

_PUT_KILLED = r"""
import sys
from engine.stream.address import StreamAddress
from engine.stream.store import StoreClient
c = StoreClient(StreamAddress.parse(sys.argv[1]))
n = int(sys.argv[3])
c.buffer.ensure(n)
print("putting", flush=True)
c.put_from(sys.argv[2], n)
print("put", flush=True)
"""


def test_a_put_over_a_killed_producers_unfinished_put_is_kept(stream_master: Master) -> None:
    """Mooncake answers a put of a key whose earlier put never finished with success and keeps
    nothing, until the master discards the earlier one: the producer puts again until the
    sample is there."""
    spec = codec.SampleSpec(T, H, "float32", False)
    n = codec.encoded_size(spec)
    g = torch.Generator().manual_seed(0)  # made first: the put must come before the discard
    s = Sample(torch.randint(0, 1000, (T,), generator=g), torch.ones(T, dtype=torch.long),
               torch.randn(T, 3 * H, generator=g), torch.randn(T, H, generator=g), None)
    client = StoreClient(stream_master.address)
    out = io.StringIO()
    ev = Emitter("stream", json_mode=True, out=out, err=io.StringIO())
    p = Producer(client, "swallow", Watermarks(4, 1, 1 << 30, 1 << 29), ev)
    p.client.buffer.ensure(n)
    child = subprocess.Popen([sys.executable, "-c", _PUT_KILLED, str(stream_master.address), KEY,
                              str(n)], cwd=REPO, env=engine_env(), stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout is not None
    assert child.stdout.readline() == "putting\n"
    try:  # killed once the master has the put under way
        wait_until(lambda: client.store.get_size(KEY) != NOT_FOUND, 30, "the child's put")
        child.kill()
        child.wait()
        assert client.store.get_size(KEY) == NOT_READY, "the put finished: make it larger"
        p.put(KEY, s, spec, 0)
        back = codec.decode(client.get_into(KEY), spec, KEY)
        assert torch.equal(back.hidden, s.hidden) and torch.equal(back.aux, s.aux)
        assert "held by an unfinished put" in out.getvalue()
        client.remove([KEY, "swallow/beat"])
    finally:
        child.kill()
        child.wait()
        client.close()
