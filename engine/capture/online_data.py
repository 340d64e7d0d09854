"""Streamed training data: features fetched from a live vLLM server batch by batch, never stored.

    python -m engine train --target T --data conv.jsonl --out RUN --online --from-vllm URL

For a dataset whose features do not fit on disk (50k conversations of 2k tokens of a Kimi-K2 class
target are ~5.7 TB): conversations are tokenised up front exactly as `prepare` does (one code
path: `prepare.tokenize_all`, then the stable sort by length, so sample i is the i-th sample of a
prepared directory and the batch plan, the vocab, the losses and checkpoints are the offline
run's). A micro-batch's features are requested from the server (engine/capture/vllm_client.py: one
`/v1/completions` request per sample, server file read under its lock, checked, final norm
applied) and each server file is deleted as soon as it is read and checked (only files inside
`server_storage`, the capture server's --storage; a file that fails the checks is left alone).

Worker process: the fetching (HTTP, file read, checks, norm, collation) runs in a child process
started with 'spawn' (as PyTorch's DataLoader workers), so it takes no CPU time or GIL from the
training step; batches come back through torch.multiprocessing shared memory, each batch packed
into one shared buffer (`_pack`): one file descriptor handed over per batch, not one per tensor
(each hand-over is a socket connection with an authentication exchange on both sides). The
child exits when the trainer does (close(), or the kernel's parent-death signal); its errors
reach the trainer as the same one-line EngineError naming the sample.

Prefetch: the trainer hands over the micro-batches it is about to train on (`schedule`, in plan
order, from the resume point on); up to `prefetch` of them are requested ahead with `concurrency`
requests in flight, so the trainer does not wait while the server keeps up. A batch asked for out
of plan order (the held-out estimate) is fetched on the spot. Only the target's config, tokenizer,
final norm and heads are read here; the server holds the model.
"""

from __future__ import annotations

import math
import os
import queue
import signal
import threading
import time
from collections import deque
from concurrent.futures import CancelledError, Future
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import Tensor

from engine.capture.vllm_client import (
    DaemonPool,
    FeatureSpec,
    GiveUp,
    ServerStorage,
    VllmClient,
    read_features,
)
from engine.data.features import FeatureData, Sample, collate
from engine.errors import EngineError
from engine.events import Emitter


class VllmStreamData(FeatureData):
    """Conversations tokenised here; features fetched from the server when a batch is read."""

    def __init__(self, path: str, target_dir: str, url: str, max_len: int,
                 model: str | None = None, concurrency: int = 16, prefetch: int = 4,
                 max_failures: int = 10, ev: Emitter | None = None,
                 server_storage: str | None = None) -> None:
        from engine.data.conversations import read_conversations
        from engine.data.prepare import tokenize_all
        from engine.data.target import default_aux_ids, load_tokenizer, read_config
        if concurrency < 1 or prefetch < 1:
            raise EngineError(f"--concurrency {concurrency} / --prefetch {prefetch}: must be >= 1")
        cfg = read_config(target_dir)
        samples, skipped = tokenize_all(load_tokenizer(target_dir), read_conversations(path),
                                        max_len)
        if not samples:
            raise EngineError(f"{path}: no conversation has an assistant turn to learn from")
        samples = sorted(samples, key=lambda s: len(s[1].input_ids))  # prepare's order
        self.path = path
        self._sid = [sid for sid, _ in samples]
        self._list = [t.input_ids for _, t in samples]
        self._ids = [torch.tensor(t.input_ids) for _, t in samples]
        self._mask = [torch.tensor(t.loss_mask) for _, t in samples]
        self.lengths = [len(x) for x in self._list]
        self.loss_counts = [int(m[2:].sum()) for m in self._mask]
        self.hidden_size = int(cfg["hidden_size"])
        self.aux_layer_ids = default_aux_ids(int(cfg["num_hidden_layers"]))
        storage = ServerStorage(server_storage) if server_storage else ServerStorage()
        self.client = VllmClient(url, model, max_failures=max_failures, storage=storage)
        self.spec = FeatureSpec.for_target(target_dir, cfg, self.aux_layer_ids)
        served = self.client.served_model()
        self.meta = {"format": "vllm-stream", "samples": len(samples), "skipped": skipped,
                     "server": self.client.root, "model": served,
                     "layer_ids": self.spec.layer_ids}
        self.prefetch = prefetch
        self._plan: deque[tuple[int, ...]] = deque()
        self._ahead: deque[tuple[tuple[int, ...], int]] = deque()  # (indices, request tag)
        self._want: dict[int, tuple[int, ...]] = {}  # requests whose batch is still wanted
        self._done: dict[int, dict[str, Tensor]] = {}
        self._tag = 0
        self.fetched = 0
        # The fetching runs in a worker process, as a DataLoader's workers do: its HTTP, checks,
        # norm and collation no longer take CPU (or the GIL) from the training step. Batches come
        # back through shared memory (torch.multiprocessing), so receiving one costs ~nothing.
        ctx = mp.get_context("spawn")
        self._req, self._res = ctx.Queue(), ctx.Queue()
        self._proc: Any = ctx.Process(
            target=_worker, name="eagle3-stream", daemon=True,
            args=(self._req, self._res, os.getpid(), url, served, target_dir, self._sid,
                  self._list, [t.tolist() for t in self._mask], concurrency, max_failures,
                  storage.given))
        self._proc.start()
        if ev is not None:
            ev.log(f"streaming features of {len(samples)} samples from {self.client.root} "
                   f"(model {served}, layer ids {self.spec.layer_ids})")

    # -- fetching (in the worker process) ------------------------------------------------------
    def _submit(self, indices: tuple[int, ...]) -> int:
        self._tag += 1
        self._want[self._tag] = indices
        self._req.put((self._tag, indices))
        return self._tag

    def _fill(self) -> None:
        while self._plan and len(self._ahead) < self.prefetch:
            idx = self._plan.popleft()
            self._ahead.append((idx, self._submit(idx)))

    def _result(self, tag: int) -> dict[str, Tensor]:
        """The collated batch of request `tag`, or the worker's error as an EngineError."""
        while tag not in self._done:
            try:
                got, batch, err = self._res.get(timeout=0.5)
            except queue.Empty:
                if not self._proc.is_alive():
                    raise EngineError(f"the feature-streaming worker process exited (exit code "
                                      f"{self._proc.exitcode}) before sending a batch") from None
                continue
            if err is not None:
                msg, give_up = err
                raise (GiveUp if give_up else EngineError)(msg)
            if got in self._want:  # else a batch of an old plan: dropped (its files are gone)
                self._done[got] = _unpack(*batch)
        self.fetched += len(self._want.pop(tag))
        return self._done.pop(tag)

    def schedule(self, batches: list[tuple[int, ...]]) -> None:
        """The micro-batches the trainer reads next, in order (replaces any earlier plan)."""
        self._plan = deque(tuple(b) for b in batches)
        old = [tag for _, tag in self._ahead]
        for tag in old:  # batches of an old plan: not fetched if not started, unused
            self._want.pop(tag, None)
        if old:
            self._req.put(("cancel", old))
        self._ahead.clear()
        self._fill()

    def batch(self, indices: tuple[int, ...] | list[int]) -> dict[str, Tensor]:
        idx = tuple(indices)
        if self._ahead and self._ahead[0][0] == idx:
            tag = self._ahead.popleft()[1]
            self._fill()
        else:
            tag = self._submit(idx)
        return self._result(tag)

    def __getitem__(self, i: int) -> Sample:
        b = self._result(self._submit((i,)))
        return Sample(self._ids[i], self._mask[i], b["aux"][0], b["hidden"][0])

    def tokens(self, i: int) -> tuple[Tensor, Tensor]:
        return self._ids[i], self._mask[i]

    def token_counts(self, vocab_size: int) -> Tensor:
        counts = torch.zeros(vocab_size, dtype=torch.int64)
        for ids, mask in zip(self._ids, self._mask, strict=True):
            counts += torch.bincount(ids[mask.bool()], minlength=vocab_size)[:vocab_size]
        return counts

    def close(self) -> None:
        if self._proc is None:
            return
        self._ahead.clear()
        try:
            self._req.put(None)
        except (OSError, ValueError):
            pass
        self._proc.join(timeout=5)
        if self._proc.is_alive():  # a request still in flight: not waited for
            self._proc.terminate()
            self._proc.join(timeout=5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._res.cancel_join_thread()
        self._req.cancel_join_thread()
        self._proc = None


PackMeta = list[tuple[str, torch.dtype, tuple[int, ...], int]]  # (name, dtype, shape, offset)


def _pack(batch: dict[str, Tensor]) -> tuple[Tensor, PackMeta]:
    """A batch as one shared-memory byte buffer and (name, dtype, shape, offset) per tensor;
    offsets 64-byte aligned so every tensor can be viewed in place (`_unpack`)."""
    meta, total = [], 0
    for name, t in batch.items():
        meta.append((name, t.dtype, tuple(t.shape), total))
        total += -(-t.nbytes // 64) * 64
    buf = torch.empty(total, dtype=torch.uint8).share_memory_()
    for name, t in _unpack(buf, meta).items():
        t.copy_(batch[name])
    return buf, meta


def _unpack(buf: Tensor, meta: PackMeta) -> dict[str, Tensor]:
    """The tensors of `_pack`, as views of the received buffer (no copy)."""
    return {name: buf[off:off + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)
            for name, dtype, shape, off in meta}


def _die_with_parent(ppid: int) -> None:
    """Exit when the trainer dies, even by SIGKILL: the kernel's parent-death signal (Linux),
    and a watcher thread for anywhere else (or a parent thread that exits before the process)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != ppid:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == ppid:
            time.sleep(0.5)
        os._exit(1)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _worker(req: Any, res: Any, ppid: int, url: str, model: str, target_dir: str,
            sids: list[str], ids: list[list[int]], masks: list[list[int]], concurrency: int,
            max_failures: int, storage: str) -> None:
    """The worker process: fetch, check, normalise and collate the batches asked for on `req`,
    in order, and put (tag, batch, None) or (tag, None, (message, give_up)) on `res`."""
    _die_with_parent(ppid)
    torch.set_num_threads(1)
    from engine.data.target import default_aux_ids, read_config
    try:
        cfg = read_config(target_dir)
        spec = FeatureSpec.for_target(target_dir, cfg,
                                      default_aux_ids(int(cfg["num_hidden_layers"])))
    except Exception as e:  # noqa: BLE001 (handed to the trainer as one line)
        res.put((0, None, (f"{target_dir}: {e}", False)))
        return
    client = VllmClient(url, model, max_failures=max_failures, storage=ServerStorage(storage))
    pool = DaemonPool(concurrency, "stream")
    order: queue.SimpleQueue[Any] = queue.SimpleQueue()
    futs: dict[int, list[Future[Sample]]] = {}

    def fetch(i: int) -> Sample:
        path = client.request(sids[i], ids[i])  # inside the storage, or refused
        aux, hidden = read_features(path, sids[i], ids[i], spec)  # a bad file stays as it is
        client.storage.remove(path)  # used: the next epoch asks again
        return Sample(torch.tensor(ids[i]), torch.tensor(masks[i]), aux, hidden)

    def collect() -> None:  # batches leave in request order, each once all its samples are in
        while True:
            tag = order.get()
            if tag is None:
                return
            fs = futs.pop(tag, [])
            try:
                batch = collate([f.result() for f in fs])
            except CancelledError:
                continue
            except BaseException as e:  # noqa: BLE001 (one line in the trainer)
                msg = str(e) if isinstance(e, EngineError) else \
                    f"feature-streaming worker: {type(e).__name__}: {e}"
                res.put((tag, None, (msg, isinstance(e, GiveUp))))
                continue
            res.put((tag, _pack(batch), None))

    collector = threading.Thread(target=collect, name="collate", daemon=True)
    collector.start()
    while True:
        msg = req.get()
        if msg is None:
            break
        if msg[0] == "cancel":
            for tag in msg[1]:
                for f in futs.get(tag, []):
                    f.cancel()
            continue
        tag, idx = msg
        futs[tag] = [pool.submit(fetch, i) for i in idx]
        order.put(tag)
    client.stopped.set()
    pool.close(wait=False)
    res.cancel_join_thread()
    os._exit(0)  # in-flight requests are not waited for; the trainer no longer reads


def open_stream(cfg: Any, ev: Emitter) -> VllmStreamData:
    """The streamed data of a TrainConfig with `from_vllm` set."""
    return VllmStreamData(cfg.data, cfg.target, cfg.from_vllm, cfg.max_len, model=cfg.vllm_model,
                          concurrency=cfg.concurrency, prefetch=cfg.prefetch, ev=ev,
                          server_storage=cfg.server_storage)
