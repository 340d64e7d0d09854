"""The states' hand-over from a vLLM worker to the capture's driver
(engine/capture/memory_files.py): an anonymous memory file of the worker's, mapped by the driver
through /proc, outliving the worker's own descriptor; given back once the driver no longer views
it and written again, never while the driver still views it."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import torch

from engine.capture.memory_files import Released
from engine.capture.vllm_worker import Packed, can_map, pack, unpack_step
from tests.paths import REPO

WORKER = """
import json, os, sys, torch
from engine.capture.memory_files import memory_file
from engine.capture.vllm_worker import pack
states = torch.arange(2 * 3 * 5, dtype=torch.float32).view(2, 3, 5)
n = states.numel() * 4
fd, mm = memory_file(n)
host = torch.frombuffer(mm, dtype=torch.uint8)[:n].view(torch.float32).view(2, 3, 5)
host.copy_(states)
print(json.dumps({"hidden_states": pack(host, [os.getpid(), fd, n])}), flush=True)
sys.stdin.readline()  # the driver has mapped it
os.close(fd)
del host
mm.close()
print("closed", flush=True)
sys.stdin.readline()
"""


def test_the_driver_maps_the_workers_file_and_keeps_it_after_the_worker_lets_go() -> None:
    proc = subprocess.Popen([sys.executable, "-c", WORKER], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        step: Packed = json.loads(proc.stdout.readline())
        hs = unpack_step(step)["hidden_states"]
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "closed\n"
        want = torch.arange(2 * 3 * 5, dtype=torch.float32).view(2, 3, 5)
        assert torch.equal(hs, want)  # the pages live on in this map alone
        assert not can_map(step["hidden_states"][2])  # not the probe's words
    finally:
        proc.stdin.close()
        proc.wait(10)
    assert torch.equal(hs[1], want[1])  # and after the worker has gone


def test_a_file_that_cannot_be_mapped_means_bytes() -> None:
    assert not can_map(None)
    assert not can_map([2**22 + 7, 3, 8])  # no such process
    step: Packed = {"x": pack(torch.tensor([1.5, 2.5]))}
    assert unpack_step(step)["x"].tolist() == [1.5, 2.5]


POOL_WORKER = """
import json, os, sys, torch
from engine.capture.memory_files import FilePool
from engine.capture.vllm_worker import host_tensor, pack
pool = FilePool(keep=2)
for line in sys.stdin:  # each line: the files the driver gave back, and the step's value
    asked = json.loads(line)
    pool.give_back(asked["released"])
    raw, host = host_tensor((64, 4, 16), torch.float32, pool)
    host.fill_(asked["value"])
    print(json.dumps({"step": {"hidden_states": pack(host, raw)}, "created": pool.created}),
          flush=True)
    del host
pool.close()
"""


def test_a_file_is_written_again_only_once_the_driver_no_longer_views_it() -> None:
    """Steps 1-4 of a worker with a pool: step 2 reuses step 1's file (given back once its
    tensor was dropped here); step 3 gets a new file while step 2's tensor is still held, and
    that tensor still reads step 2's values after steps 3 and 4 were written."""
    proc = subprocess.Popen([sys.executable, "-c", POOL_WORKER], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    released = Released()

    def step(value: float) -> tuple[torch.Tensor, int, int]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"released": released.drain(), "value": value}) + "\n")
        proc.stdin.flush()
        got = json.loads(proc.stdout.readline())
        hs = unpack_step(got["step"], released)["hidden_states"]
        return hs, int(got["step"]["hidden_states"][2][1]), int(got["created"])

    try:
        one, fd1, created = step(1.0)
        assert created == 1 and bool((one == 1.0).all())
        del one
        gc.collect()
        two, fd2, created = step(2.0)
        assert (fd2, created) == (fd1, 1)  # the same file, written again without a new one
        three, fd3, created = step(3.0)
        assert fd3 != fd2 and created == 2  # two's is still viewed here
        del three
        gc.collect()
        four, fd4, created = step(4.0)
        assert (fd4, created) == (fd3, 2)
        assert bool((two == 2.0).all()) and bool((four == 4.0).all())
    finally:
        proc.stdin.close()
        proc.wait(10)
    assert bool((two == 2.0).all())  # the pages live on in this map after the worker is gone
