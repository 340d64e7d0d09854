"""The stream's parts against a real Mooncake master on 127.0.0.1: the master we own (started on
free ports, stopped only while its PID is ours), the store client, the sample codec and the
run manifest through real puts and gets, one-line errors for what does not fit, and the pool's
watermarks."""

from __future__ import annotations

import io
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from engine.data.features import Sample
from engine.errors import EngineError
from engine.events import Emitter
from engine.stream import codec, keys
from engine.stream import manifest as mf
from engine.stream.address import StreamAddress
from engine.stream.master import Master, start_master
from engine.stream.pool import InFlight, Watermarks
from engine.stream.store import StoreClient
from tests.engine_helpers import REPO, engine_env
from tests.stream_store import store_count
from tests.waiting import wait_until

pytest_plugins = ("tests.stream_store",)
pytestmark = pytest.mark.usefixtures("mooncake")


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def client(stream_master: Master) -> StoreClient:
    c = StoreClient(stream_master.address, segment_bytes=64 << 20)
    yield c
    c.close()


def _sample(t: int, h: int, dtype: torch.dtype, argmax: bool) -> Sample:
    g = torch.Generator().manual_seed(t)
    return Sample(torch.randint(0, 1000, (t,), generator=g), torch.randint(0, 2, (t,), generator=g),
                  torch.randn(t, 3 * h, generator=g).to(dtype), torch.randn(t, h, generator=g
                                                                           ).to(dtype),
                  torch.randint(0, 1000, (t,), generator=g) if argmax else None)


def test_the_master_listens_on_loopback_and_stops() -> None:
    """Its own log (no --log given) goes with it."""
    m = start_master("127.0.0.1")
    try:
        assert m.log.is_file()
        assert m.address.host == "127.0.0.1" and m.ours()
        assert _accepts(m.address.rpc_port) and _accepts(m.address.metadata_port)
        assert StreamAddress.parse(str(m.address)) == m.address
    finally:
        m.stop()
    assert m.proc is not None and m.proc.poll() is not None
    assert not _accepts(m.address.rpc_port) and not m.log.parent.exists()


def test_the_stream_master_command_serves_until_stopped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`engine stream-master` says its address in a file; a client lending no memory puts into
    the memory its holder lends; SIGTERM stops the holder and the master it started and ends
    the command cleanly."""
    where = tmp_path / "address"
    p = subprocess.Popen([sys.executable, "-m", "engine", "stream-master", "--address-file",
                          str(where), "--log", str(tmp_path / "master.log"), "--json",
                          "--segment-gb", "0.0625"],
                         cwd=REPO, env=engine_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        wait_until(where.is_file, 30, "the address file")
        addr = StreamAddress.parse(where.read_text())
        assert addr.host == "127.0.0.1"
        c = StoreClient(addr)
        c.put_bytes("cmd/x", b"hello")
        assert c.get_bytes("cmd/x") == b"hello"
        c.close()
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err[-2000:]
    answer = json.loads(out)
    assert answer["address"] == str(addr) and answer["segment_bytes"] == 64 << 20
    assert not where.exists() and not _accepts(addr.rpc_port)
    assert not Path(f"/proc/{answer['holder_pid']}").exists()


def test_a_store_that_does_not_answer_is_one_line_at_once() -> None:
    """No master on the address: a one-line error at once, where Mooncake alone retries for
    minutes (the client is what stream-put and the trainer's reader both open)."""
    from engine.stream.master import free_port
    dead = StreamAddress("127.0.0.1", free_port("127.0.0.1"), free_port("127.0.0.1"))
    t0 = time.monotonic()
    with pytest.raises(EngineError, match=r"its master does not answer on 127\.0\.0\.1:") as e:
        StoreClient(dead)
    assert time.monotonic() - t0 < 10 and "\n" not in str(e.value)


def test_stop_signals_only_the_process_it_started(stream_master: Master) -> None:
    """A record whose PID now names another process (another start time) signals nothing."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        Master(stream_master.address, other.pid, "not-its-start-time", stream_master.log).stop(
            grace_s=0.2)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize(("dtype", "argmax"), [(torch.float32, True), (torch.bfloat16, False)])
def test_a_sample_goes_through_the_store_unchanged(client: StoreClient, dtype: torch.dtype,
                                                   argmax: bool) -> None:
    s = _sample(37, 16, dtype, argmax)
    spec = codec.SampleSpec(37, 16, str(dtype).removeprefix("torch."), argmax)
    key = keys.sample_key("rt", 0, int(argmax))
    n = codec.encode(s, spec, client.buffer.ensure(codec.encoded_size(spec)))
    assert n == codec.encoded_size(spec)
    client.put_from(key, n)
    back = codec.decode(client.get_into(key), spec, key)
    for name in ("input_ids", "loss_mask", "aux", "hidden", "target_argmax"):
        a, b = getattr(s, name), getattr(back, name)
        assert (a is None and b is None) or torch.equal(a.to(b.dtype), b), name
    assert back.input_ids.dtype == back.loss_mask.dtype == torch.long
    client.remove([key])
    assert client.exists([key]) == [False]


def test_a_sample_that_does_not_fit_its_spec_is_one_line(client: StoreClient) -> None:
    spec = codec.SampleSpec(8, 4, "float32", False)
    key = keys.sample_key("bad", 0, 1)
    n = codec.encode(_sample(8, 4, torch.float32, False), spec,
                     client.buffer.ensure(codec.encoded_size(spec)))
    client.put_from(key, n)
    got = client.get_into(key).clone()
    cases = [
        (codec.SampleSpec(8, 4, "bfloat16", False), "'aux' is float32, expected bfloat16"),
        (codec.SampleSpec(9, 4, "float32", False), "'input_ids' has shape [8], expected [9]"),
        (codec.SampleSpec(8, 4, "float32", True), "tensors"),
    ]
    for want, words in cases:
        with pytest.raises(EngineError) as e:
            codec.decode(got, want, key)
        assert key in str(e.value) and words in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(EngineError, match="not a sample of ours"):
        codec.decode(torch.zeros(64, dtype=torch.uint8), spec, key)
    with pytest.raises(EngineError, match="runs past"):
        codec.decode(got[:n - 64], spec, key)
    client.remove([key])


def test_the_manifest_goes_through_the_store(client: StoreClient) -> None:
    class Two:
        lengths, loss_counts, hidden_size = [3, 2], [1, 0], 4
        aux_layer_ids, has_target_argmax = [0, 1, 2], True

        def __len__(self) -> int:
            return 2

        def tokens(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.arange(self.lengths[i]) + 10 * i, torch.ones(self.lengths[i])

    m = mf.build(Two(), "float32", {"target": {"config_sha256": "ab"}})
    client.put_bytes(keys.manifest_key("mf"), mf.encode(m))
    raw = client.get_bytes(keys.manifest_key("mf"))
    assert raw is not None
    back = mf.decode(raw, "mf/manifest")
    assert back.lengths == (3, 2) and back.digest == m.digest and back.meta == m.meta
    assert [t.tolist() for t in back.tokens(1)] == [[10, 11], [1, 1]]
    with pytest.raises(EngineError, match=r"^stream manifest mf/manifest: 24 bytes of tokens"):
        mf.decode(raw[:-1], "mf/manifest")
    assert client.get_bytes(keys.manifest_key("none")) is None


def test_addresses_and_run_names_are_checked() -> None:
    for bad in ("127.0.0.1:50051", "127.0.0.1:0/1", "host:70000/1"):
        with pytest.raises(EngineError, match="--from-stream"):
            StreamAddress.parse(bad)
    with pytest.raises(EngineError, match="--stream-run '../x'"):
        keys.check_run("../x")


def test_the_pool_pauses_at_high_until_the_trainer_brings_it_to_low(
        stream_master: Master, client: StoreClient) -> None:
    """4 samples put with high 4, low 1: the 5th waits until 3 are removed, not 1."""
    out = io.StringIO()
    ev = Emitter("stream", json_mode=True, out=out, err=io.StringIO())
    pool = InFlight(Watermarks(4, 1, 1 << 20, 1 << 19), client.exists, ev, poll_s=0.005)
    names = [f"pool/{i}" for i in range(4)]
    for k in names:
        client.put_bytes(k, b"x" * 1000)
        pool.add(k, 1000)
    base = store_count(stream_master)
    removing: list[float] = []

    def trainer() -> None:
        for k in names[:3]:
            time.sleep(0.1)
            # Stamped before the remove: the pool may see a sample gone before remove returns.
            removing.append(time.monotonic())
            client.remove([k])

    t = threading.Thread(target=trainer)
    t.start()
    pool.wait_room(1000, "pool/4")
    back = time.monotonic()
    t.join()
    assert len(removing) == 3 and back >= removing[2]
    assert len(pool.keys) == 1 and pool.pauses == 1 and pool.paused_s >= 0.25
    assert store_count(stream_master) == base - 3
    text = out.getvalue()
    assert "stream producer paused: pool at 4 samples" in text
    assert "stream producer resumed after" in text
    with pytest.raises(EngineError, match="more than the pool's high watermark"):
        pool.wait_room(2 << 20, "pool/big")
    client.remove(names)


def test_a_starved_trainer_gets_its_step_before_the_pool_is_down_to_low(
        client: StoreClient) -> None:
    """Pool at high (4) with steps 0 and 1 half in; the trainer takes step 0 and then waits for
    the rest of step 1: its next sample goes in at once (2 in flight, above low 1), where
    waiting for low would wait forever. A sample of a later step still waits for low."""
    ev = Emitter("stream", json_mode=True, out=io.StringIO(), err=io.StringIO())
    pool = InFlight(Watermarks(4, 1, 1 << 20, 1 << 19), client.exists, ev, poll_s=0.005)
    names = {"st/0.a": 0, "st/0.b": 0, "st/1.a": 1, "st/1.b": 1}
    for k, step in names.items():
        client.put_bytes(k, b"x" * 100)
        pool.add(k, 100, step)
    client.remove(["st/0.a", "st/0.b"])
    done = threading.Event()
    t = threading.Thread(target=lambda: (pool.wait_room(100, "st/1.c", 1), done.set()),
                         daemon=True)
    t.start()
    assert done.wait(5), "the producer waited for low while the trainer starved"
    for k, step in (("st/1.c", 1), ("st/2.a", 2)):  # back at high: 1.a-c, 2.a
        client.put_bytes(k, b"x" * 100)
        pool.add(k, 100, step)
    later = threading.Thread(target=pool.wait_room, args=(100, "st/2.b", 2), daemon=True)
    later.start()
    client.remove(["st/1.a", "st/1.b"])
    later.join(0.3)
    assert later.is_alive()  # 2 in flight > low 1, and step 1 is all in: it waits for low
    client.remove(["st/1.c"])
    later.join(5)
    assert not later.is_alive()
    client.remove([*names, "st/1.c", "st/2.a"])


def test_a_starved_step_gets_room_from_later_steps_put_before(client: StoreClient) -> None:
    """A producer started again finds steps 1 and 2 in the store (high: 4) while the trainer
    waits for step 0: later steps' samples go, the latest first, until step 0's sample fits;
    without that both sides would wait on each other for ever."""
    out = io.StringIO()
    ev = Emitter("stream", json_mode=True, out=out, err=io.StringIO())
    stop = threading.Event()

    def between() -> None:  # a failed test must not leave the thread polling a closed client
        if stop.is_set():
            raise RuntimeError("stopped")

    pool = InFlight(Watermarks(4, 1, 1 << 20, 1 << 19), client.exists, ev, poll_s=0.005,
                    between=between, remove=client.remove)
    names = {"room/1.a": 1, "room/1.b": 1, "room/2.a": 2, "room/2.b": 2}
    for k, step in names.items():
        client.put_bytes(k, b"x" * 100)
        pool.add(k, 100, step)
    done = threading.Event()
    t = threading.Thread(target=lambda: (pool.wait_room(100, "room/0.a", 0), done.set()),
                         daemon=True)
    t.start()
    try:
        assert done.wait(5), "the producer waited while the trainer starved on step 0"
    finally:
        stop.set()
        t.join(5)
    kept = [k for k, there in zip(names, client.exists(list(names)), strict=True) if there]
    assert kept[:2] == ["room/1.a", "room/1.b"] and len(kept) == 3 and set(pool.keys) == set(kept)
    assert pool.made_room == 1
    assert "removing samples of later steps to make room for step 0" in out.getvalue()
    client.remove(list(names))
