"""A real Mooncake master on 127.0.0.1 for the stream tests, one per test module, a reader of
its object count, and the 2-process torchrun trainer they compare by its numbers.

Use with `pytest_plugins = ("tests.stream_store",)`, and `pytestmark =
pytest.mark.usefixtures("mooncake")` in a module whose tests all need Mooncake. Where its store
cannot load (the `stream` extra not installed, or the RDMA and NUMA libraries it links against
even for TCP absent) they skip, as the sshd tests do without sshd; EAGLE3_REQUIRE_MOONCAKE=1
(.ci/run sets it) makes that a failure instead.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.data.features import Sample
from engine.events import Emitter
from engine.stream import codec, keys
from engine.stream import manifest as mf
from engine.stream.master import Master, start_master
from engine.stream.store import StoreClient
from engine.stream.stream_data import StreamData
from tests.engine_helpers import REPO, engine_env, events

#: the memory the test store's holder lends (reserved, used as objects arrive)
SEGMENT_BYTES = 512 << 20


@pytest.fixture(scope="session")
def mooncake() -> None:
    """Skip (fail under EAGLE3_REQUIRE_MOONCAKE) where Mooncake's store cannot be loaded."""
    try:
        import mooncake.store  # noqa: F401
    except (ImportError, OSError) as e:
        why = f"Mooncake's store does not load here ({e}): pip install '.[stream]' and apt-get " \
              "install libibverbs1 librdmacm1 libnuma1 libnl-3-200 libnl-route-3-200"
        if os.environ.get("EAGLE3_REQUIRE_MOONCAKE"):
            pytest.fail(f"EAGLE3_REQUIRE_MOONCAKE is set but {why}")
        pytest.skip(why)


@pytest.fixture(scope="module")
def stream_master(mooncake: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Master]:
    m = start_master("127.0.0.1", log=tmp_path_factory.mktemp("mooncake") / "master.log",
                     segment_bytes=SEGMENT_BYTES)
    try:
        yield m
    finally:
        m.stop()


def store_count(m: Master, name: str = "master_key_count") -> int:
    """A counter of the master's metrics page (objects in the store, evictions ...)."""
    assert m.metrics_url is not None and m.metrics_url.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(m.metrics_url, timeout=5) as r:  # noqa: S310 (loopback)
        text = r.read().decode()
    found = re.search(rf"^{name} (\d+)", text, re.M)
    assert found, f"{name} not on {m.metrics_url}"
    return int(found.group(1))


class CountWatch:
    """Samples the store's object count every `every_s` in a thread; `peak` is the highest."""

    def __init__(self, m: Master, every_s: float = 0.02) -> None:
        self.m, self.every_s, self.peak, self.seen = m, every_s, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, store_count(self.m))
            self.seen += 1
            self._stop.wait(self.every_s)

    def __enter__(self) -> CountWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def log_tail(path: Path) -> str:
    return path.read_text(errors="replace")[-2000:] if path.is_file() else ""


def torchrun(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", "-m", "engine", *args],
                       cwd=REPO, env=engine_env(), capture_output=True, text=True, timeout=600)
    assert not check or p.returncode == 0, p.stderr[-4000:]
    return p


def numbers(run: Path) -> dict[int, dict[str, Any]]:
    """step -> the training step's numbers, timings left out."""
    timing = ("t_", "tokens_per_s", "step_time_s")
    return {e["step"]: {k: v for k, v in e["values"].items() if not k.startswith(timing)}
            for e in events(run / "events.jsonl") if e["kind"] == "metric" and "name" not in e}


class Tiny:
    """Eight short samples: what the stream manifest's build reads of a FeatureData."""

    lengths, loss_counts, hidden_size = [4] * 8, [2] * 8, 4
    aux_layer_ids, has_target_argmax = [0, 1, 2], False

    def __len__(self) -> int:
        return 8

    def tokens(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.arange(4) + i, torch.tensor([0, 1, 1, 0])


def tiny(i: int) -> Sample:
    """Sample `i` of Tiny, the same every time."""
    g = torch.Generator().manual_seed(i)
    return Sample(torch.arange(4) + i, torch.tensor([0, 1, 1, 0]), torch.randn(4, 12, generator=g),
                  torch.randn(4, 4, generator=g), None)


def open_tiny(producer: StoreClient, run: str, out: io.StringIO, **kw: Any) -> StreamData:
    """A trainer's StreamData on run `run` of Tiny (its manifest put by `producer`), reporting
    as JSON lines to `out`."""
    m = mf.build(Tiny(), "float32", {})
    producer.put_bytes(keys.manifest_key(run), mf.encode(m))
    ev = Emitter("train", json_mode=True, out=out, err=io.StringIO())
    return StreamData(producer.address, run, ev, **kw)


def put_tiny(producer: StoreClient, data: StreamData, run: str, i: int) -> None:
    """Put sample `i` of Tiny as epoch 0 of run `run` would have it."""
    spec = data.manifest.spec(i)
    n = codec.encode(tiny(i), spec, producer.buffer.ensure(codec.encoded_size(spec)))
    producer.put_from(keys.sample_key(run, 0, i), n)
