"""The states' hand-over from a vLLM worker to the capture's driver: an anonymous memory file of
the worker's, mapped by the driver through /proc, outliving the worker's own descriptor."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from engine.capture.vllm_worker import Packed, can_map, pack, unpack_step
from tests.paths import REPO

WORKER = """
import json, os, sys, torch
from engine.capture.vllm_worker import memory_file, pack
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
