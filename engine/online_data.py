"""Streamed training data: features fetched from a live vLLM server batch by batch, never stored.

    python -m engine train --target T --data conv.jsonl --out RUN --online --from-vllm URL

For a dataset whose features do not fit on disk (50k conversations of 2k tokens of a Kimi-K2 class
target are ~5.7 TB): conversations are tokenised up front exactly as `prepare` does (one code
path: `prepare.tokenize_all`, then the stable sort by length, so sample i is the i-th sample of a
prepared directory and the batch plan, the vocab, the losses and checkpoints are the offline
run's). A micro-batch's features are requested from the server (engine/vllm_client.py: one
`/v1/completions` request per sample, server file read under its lock, checked, final norm
applied) and each server file is deleted as soon as it is read.

Prefetch: the trainer hands over the micro-batches it is about to train on (`schedule`, in plan
order, from the resume point on); up to `prefetch` of them are requested ahead with `concurrency`
requests in flight, so the trainer does not wait while the server keeps up. A batch asked for out
of plan order (the held-out estimate) is fetched on the spot. Only the target's config, tokenizer,
final norm and heads are read here; the server holds the model.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future
from typing import Any

import torch
from torch import Tensor

from engine.data import FeatureData, Sample, collate
from engine.errors import EngineError
from engine.events import Emitter
from engine.vllm_client import (
    DaemonPool,
    FeatureSpec,
    VllmClient,
    read_features,
    remove_server_file,
)


class VllmStreamData(FeatureData):
    """Conversations tokenised here; features fetched from the server when a batch is read."""

    def __init__(self, path: str, target_dir: str, url: str, max_len: int,
                 model: str | None = None, concurrency: int = 16, prefetch: int = 4,
                 max_failures: int = 10, ev: Emitter | None = None) -> None:
        from engine.conversations import read_conversations
        from engine.prepare import tokenize_all
        from engine.target import default_aux_ids, load_tokenizer, read_config
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
        self.client = VllmClient(url, model, max_failures=max_failures)
        self.spec = FeatureSpec.for_target(target_dir, cfg, self.aux_layer_ids)
        served = self.client.served_model()
        self.meta = {"format": "vllm-stream", "samples": len(samples), "skipped": skipped,
                     "server": self.client.root, "model": served,
                     "layer_ids": self.spec.layer_ids}
        self.prefetch = prefetch
        self._pool = DaemonPool(concurrency, "stream")
        self._plan: deque[tuple[int, ...]] = deque()
        self._ahead: deque[tuple[tuple[int, ...], list[Future[Sample]]]] = deque()
        self.fetched = 0
        if ev is not None:
            ev.log(f"streaming features of {len(samples)} samples from {self.client.root} "
                   f"(model {served}, layer ids {self.spec.layer_ids})")

    # -- fetching ------------------------------------------------------------------------------
    def _fetch(self, i: int) -> Sample:
        path = self.client.request(self._sid[i], self._list[i])
        try:
            aux, hidden = read_features(path, self._sid[i], self._list[i], self.spec)
        finally:
            remove_server_file(path)  # used: the next epoch asks again
        self.fetched += 1
        return Sample(self._ids[i], self._mask[i], aux, hidden)

    def _submit(self, indices: tuple[int, ...]) -> list[Future[Sample]]:
        return [self._pool.submit(self._fetch, i) for i in indices]

    def _fill(self) -> None:
        while self._plan and len(self._ahead) < self.prefetch:
            idx = self._plan.popleft()
            self._ahead.append((idx, self._submit(idx)))

    def schedule(self, batches: list[tuple[int, ...]]) -> None:
        """The micro-batches the trainer reads next, in order (replaces any earlier plan)."""
        self._plan = deque(tuple(b) for b in batches)
        for _, futs in self._ahead:  # batches of an old plan: let them finish, unused
            for f in futs:
                f.cancel()
        self._ahead.clear()
        self._fill()

    def batch(self, indices: tuple[int, ...] | list[int]) -> dict[str, Tensor]:
        idx = tuple(indices)
        if self._ahead and self._ahead[0][0] == idx:
            futs = self._ahead.popleft()[1]
            self._fill()
        else:
            futs = self._submit(idx)
        return collate([f.result() for f in futs])

    def __getitem__(self, i: int) -> Sample:
        return self._submit((i,))[0].result()

    def tokens(self, i: int) -> tuple[Tensor, Tensor]:
        return self._ids[i], self._mask[i]

    def token_counts(self, vocab_size: int) -> Tensor:
        counts = torch.zeros(vocab_size, dtype=torch.int64)
        for ids, mask in zip(self._ids, self._mask, strict=True):
            counts += torch.bincount(ids[mask.bool()], minlength=vocab_size)[:vocab_size]
        return counts

    def close(self) -> None:
        self.client.stopped.set()
        for _, futs in self._ahead:
            for f in futs:
                f.cancel()
        self._ahead.clear()
        self._pool.close(wait=True)


def open_stream(cfg: Any, ev: Emitter) -> VllmStreamData:
    """The streamed data of a TrainConfig with `from_vllm` set."""
    return VllmStreamData(cfg.data, cfg.target, cfg.from_vllm, cfg.max_len, model=cfg.vllm_model,
                          concurrency=cfg.concurrency, prefetch=cfg.prefetch, ev=ev)
