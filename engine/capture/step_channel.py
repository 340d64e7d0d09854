"""TP rank 0's captured steps told to the capture's driver the moment they are written, over a
Unix socket of the driver's, so the driver never asks vLLM for them between engine steps.

A step's token ids, positions and states [T, L, H] are written into one of the worker's memory
files (engine/capture/memory_files.py) inside the forward, and one JSON line names the file and
where each tensor lies in it. The driver maps the file once and views the three tensors.

Why not vLLM's collective_rpc: an RPC to the workers goes through vLLM's engine core, which
answers it only between two engine steps. Asked after a call's outputs, with the next call
already queued and stepping, its answer came a whole step late, and without a next call queued
the engine sat idle through the round trip (0.05-0.07 s a call measured here, against 0.03 s
for a bare prefill's own gaps). A step's line is written before vLLM sends that step's outputs,
so once the driver holds a call's outputs, the lines of its steps are already in its socket.

The other way the driver sends the memory files it no longer maps (JSON lists of descriptors);
the worker reads them before it takes a file for its next step. The socket lies in a directory
of the driver's own (mode 0700), removed at the end; only JSON crosses it, never pickle.
"""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import socket
import tempfile
import time
from typing import Any

import torch
from torch import Tensor

from engine.capture.memory_files import FilePool, Released, map_worker_file
from engine.errors import EngineError

#: the tensors of a step, in their order in its file
PARTS = ("hidden_states", "input_ids", "positions")
_ALIGN = 64


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def stack_states(states: list[Tensor], n: int, out: Tensor) -> None:
    """The first `n` rows of each state stacked into `out` [n, L, H] (host memory), in place
    where the states are on the CPU."""
    if states[0].is_cpu:
        torch.stack([s[:n] for s in states], dim=1, out=out)
    else:
        out.copy_(torch.stack([s[:n] for s in states], dim=1))


def write_step(files: FilePool, ids: Tensor, positions: Tensor, states: list[Tensor]
               ) -> dict[str, Any]:
    """(Worker.) The step written into one of `files` (ids and positions as int64, the states
    stacked [T, L, H]); the line that names it: {"file": [pid, fd, nbytes], "parts": {name:
    [dtype, shape, offset]}}."""
    n = positions.shape[0]
    shape = [n, len(states), int(states[0].shape[-1])]
    dtype = states[0].dtype
    state_bytes = math.prod(shape) * dtype.itemsize
    offsets, at = {}, 0
    for name, nbytes in zip(PARTS, (state_bytes, 8 * n, 8 * n), strict=True):
        offsets[name] = at
        at = _aligned(at + nbytes)
    fd, mm = files.take(at)
    flat = torch.frombuffer(mm, dtype=torch.uint8)
    stack_states(states, n, flat[:state_bytes].view(dtype).view(shape))
    for name, t in (("input_ids", ids[:n]), ("positions", positions)):
        flat[offsets[name]:offsets[name] + 8 * n].view(torch.int64).copy_(t)
    return {"file": [os.getpid(), fd, at],
            "parts": {"hidden_states": [str(dtype).removeprefix("torch."), shape,
                                        offsets["hidden_states"]],
                      "input_ids": ["int64", [n], offsets["input_ids"]],
                      "positions": ["int64", [n], offsets["positions"]]}}


def read_step(line: dict[str, Any], released: Released) -> dict[str, Tensor]:
    """(Driver.) The tensors of a step's line, viewing the worker's file (mapped read-only,
    once: `released` hears of the file when no tensor views it any more)."""
    import warnings
    mm = map_worker_file(line["file"], released)
    with warnings.catch_warnings():  # a read-only map; nothing writes through it
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(mm, dtype=torch.uint8)
    out = {}
    for name, (dtype, shape, offset) in line["parts"].items():
        dt = getattr(torch, dtype)
        n = math.prod(int(s) for s in shape) * dt.itemsize
        out[name] = flat[int(offset):int(offset) + n].view(dt).reshape(shape)
    return out


class _Lines:
    """JSON lines off a socket, as many as have come whole."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def read(self, timeout: float | None) -> list[Any] | None:
        """The whole lines that came within `timeout` (0: what is there now); None at the end
        (the other side closed)."""
        if select.select([self.sock], [], [], timeout)[0]:
            try:
                got = self.sock.recv(1 << 16)
            except BlockingIOError:  # woken with nothing to read
                got = None
            if got == b"":
                return None
            self.buf += got or b""
        *whole, self.buf = self.buf.split(b"\n")
        return [json.loads(w) for w in whole if w]


class DriverEnd:
    """The driver's side: a listening socket in a private directory, then the worker's
    connection."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="eagle3-capture-")  # 0700
        self.path = os.path.join(self.dir, "steps.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(1)
        self.conn: socket.socket | None = None
        self.lines: _Lines | None = None

    def accept(self, timeout: float) -> None:
        """The worker's connection, made during the hand-over RPC (so already queued)."""
        self.listener.settimeout(timeout)
        try:
            self.conn, _ = self.listener.accept()
        except TimeoutError:
            raise EngineError(f"capture: vLLM's TP rank 0 worker did not connect to {self.path} "
                              f"within {timeout:.0f}s") from None
        self.lines = _Lines(self.conn)

    def steps(self, wait_s: float = 0.0) -> list[dict[str, Any]]:
        """The lines of the steps written since the last call; with `wait_s`, waits that long
        for the first one if none is there."""
        assert self.lines is not None
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + wait_s
        while True:
            lines = self.lines.read(0 if got else max(0.0, deadline - time.monotonic()))
            if lines is None:
                raise EngineError("capture: vLLM's TP rank 0 worker closed its channel (did "
                                  "the engine die?)")
            if not lines:
                return got
            got += lines

    def give_back(self, fds: list[int]) -> None:
        if fds and self.conn is not None:
            self.conn.sendall(json.dumps(fds).encode() + b"\n")

    def close(self) -> None:
        for s in (self.conn, self.listener):
            if s is not None:
                s.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class WorkerEnd:
    """Rank 0's side: connected to the driver's socket."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.setblocking(False)  # the lines given back are read without waiting
        self.lines = _Lines(self.sock)

    def send(self, line: dict[str, Any]) -> None:
        data = json.dumps(line, separators=(",", ":")).encode() + b"\n"
        self.sock.setblocking(True)  # a line is a few hundred bytes: the buffer takes it
        try:
            self.sock.sendall(data)
        finally:
            self.sock.setblocking(False)

    def given_back(self) -> list[int]:
        """The files the driver has given back since the last call."""
        out: list[int] = []
        while (lines := self.lines.read(0)):
            for fds in lines:
                out += [int(f) for f in fds]
        return out

    def close(self) -> None:
        self.sock.close()
