"""The states' hand-over from a vLLM worker to the capture's driver (engine/capture/step_channel.py,
engine/capture/memory_files.py): a step written into an anonymous memory file of the worker's and
named over the driver's socket; the driver maps it through /proc, and the map outlives the
worker's own descriptor; a file is given back once the driver no longer views it and written
again, never while the driver still views it."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import torch

from engine.capture.memory_files import Released
from engine.capture.step_channel import DriverEnd, read_step
from engine.capture.vllm_worker import Packed, can_map, pack, unpack_step
from tests.paths import REPO

# argv: the driver's socket. Each stdin line: a step's value to write (empty line: the end)
WORKER = """
import json, sys, torch
from engine.capture.memory_files import FilePool
from engine.capture.step_channel import WorkerEnd, write_step
chan, pool = WorkerEnd(sys.argv[1]), FilePool(keep=2)
n = 64
for line in sys.stdin:
    if not line.strip():
        break
    pool.give_back(chan.given_back())
    v = float(line)
    states = [torch.full((n, 16), v + k) for k in range(3)]
    chan.send(write_step(pool, torch.arange(n, dtype=torch.int32) + 7, torch.arange(n), states))
    print(json.dumps({"created": pool.created}), flush=True)
pool.close()
print("closed", flush=True)
sys.stdin.readline()
"""


class Worker:
    def __init__(self) -> None:
        self.driver = DriverEnd()
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, self.driver.path],
                                     cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        self.driver.accept(timeout=60)
        self.released = Released()

    def say(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline()

    def step(self, value: float) -> tuple[dict[str, torch.Tensor], int, int]:
        """The worker's next step as viewed here, its file's descriptor, files made so far."""
        self.driver.give_back(self.released.drain())
        created = json.loads(self.say(str(value)))["created"]
        lines = self.driver.steps(wait_s=10)
        assert len(lines) == 1
        return read_step(lines[0], self.released), int(lines[0]["file"][1]), created

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)
        self.driver.close()


def test_a_step_crosses_as_a_file_the_driver_maps_and_keeps_after_the_worker_lets_go() -> None:
    w = Worker()
    try:
        step, _, _ = w.step(1.0)
        assert step["input_ids"].tolist() == list(range(7, 71))  # int32 there, int64 here
        assert step["positions"].tolist() == list(range(64))
        hs = step["hidden_states"]
        assert hs.shape == (64, 3, 16)
        want = torch.stack([torch.full((64, 16), 1.0 + k) for k in range(3)], dim=1)
        assert torch.equal(hs, want)
        assert w.say("") == "closed\n"  # the worker has closed its files and maps
        assert torch.equal(hs, want)  # the pages live on in this map alone
    finally:
        w.close()
    assert torch.equal(hs[5], want[5])  # and after the worker has gone


def test_a_file_that_cannot_be_mapped_means_bytes() -> None:
    assert not can_map(None)
    assert not can_map([2**22 + 7, 3, 8])  # no such process
    step: Packed = {"x": pack(torch.tensor([1.5, 2.5]))}
    assert unpack_step(step)["x"].tolist() == [1.5, 2.5]


def test_a_file_is_written_again_only_once_the_driver_no_longer_views_it() -> None:
    """Steps 1-4 of a worker with a pool: step 2 reuses step 1's file (given back once its
    tensors were dropped here); step 3 gets a new file while step 2's are still held, and they
    still read step 2's values after steps 3 and 4 were written."""
    w = Worker()
    try:
        one, fd1, created = w.step(1.0)
        assert created == 1 and bool((one["hidden_states"][:, 0] == 1.0).all())
        del one
        gc.collect()
        two, fd2, created = w.step(2.0)
        assert (fd2, created) == (fd1, 1)  # the same file, written again without a new one
        three, fd3, created = w.step(3.0)
        assert fd3 != fd2 and created == 2  # two's is still viewed here
        del three
        gc.collect()
        four, fd4, created = w.step(4.0)
        assert (fd4, created) == (fd3, 2)
        assert bool((two["hidden_states"][:, 2] == 4.0).all())
        assert bool((four["hidden_states"][:, 0] == 4.0).all())
        hs2 = two["hidden_states"]
    finally:
        w.close()
    assert bool((hs2[:, 0] == 2.0).all())  # the pages live on in this map after the worker
