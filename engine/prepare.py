"""Training data from conversations: chat template, loss mask, target features, safetensors shards.

`python -m engine prepare --target TARGET_DIR --data conv.jsonl --out DATA_DIR [--max-len 2048]`

Data directory format (version 1), read by engine/data.py (train, eval) and by `vocab build --data`:

    DATA_DIR/manifest.json
    DATA_DIR/shard_00000.safetensors, shard_00001.safetensors, ...

Each shard holds S samples concatenated along the token axis (no padding), N tokens in all:
    input_ids          int32  [N]        token ids (chat template applied)
    loss_mask          uint8  [N]        1 on assistant tokens (content and end-of-turn marker)
    offsets            int64  [S+1]      sample s is tokens offsets[s] .. offsets[s+1]-1
    aux_hidden_states  DTYPE  [N, 3*Ht]  inputs of the three aux decoder layers, low|mid|high
                                         (residual stream, not normalised; spec section 2)
    hidden_states      DTYPE  [N, Ht]    the target's final hidden state AFTER its final norm (the
                                         lm_head input); target logits = lm_head(hidden_states)
The shard's safetensors metadata carries `ids` (JSON list of the S conversation ids).
DTYPE is the manifest's `dtype` (float32 on CPU, the target's dtype on GPU by default).

manifest.json:
    format "eagle3-console-data", version 1, samples, tokens, loss_tokens,
    skipped {no_assistant_tokens, template_error}, max_len, dtype,
    aux_layer_ids (vLLM convention: id k = INPUT of decoder layer k), hidden_state "final_norm",
    target {path, config_sha256, num_hidden_layers, hidden_size, vocab_size},
    source {path, sha256}, shards [{file, samples, tokens}], created, engine.

The directory is written under a temporary name and renamed when complete: a killed prepare leaves
no DATA_DIR behind. Samples are grouped by length for the target's batches, so shard order is not
the input order (training shuffles anyway).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from engine import __version__
from engine.chat import Tokenized, tokenize_conversation
from engine.conversations import Conversation, read_conversations
from engine.errors import EngineError
from engine.events import Emitter
from engine.target import Target, config_hash

FORMAT = "eagle3-console-data"
VERSION = 1


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tokenize_all(tok: Any, convs: list[Conversation], max_len: int, ev: Emitter | None = None
                 ) -> tuple[list[tuple[str, Tokenized]], dict[str, int]]:
    """Template + mask every conversation; drop (and count) those with no assistant token."""
    kept: list[tuple[str, Tokenized]] = []
    skipped = {"no_assistant_tokens": 0, "template_error": 0}
    for n, c in enumerate(convs):
        try:
            t = tokenize_conversation(tok, c.turns, max_len)
        except EngineError as e:
            skipped["template_error"] += 1
            if ev is not None and skipped["template_error"] <= 3:
                ev.log(f"conversation {c.id!r}: {e}", level="warning")
            continue
        if sum(t.loss_mask) == 0:
            skipped["no_assistant_tokens"] += 1
            continue
        kept.append((c.id, t))
        if ev is not None:
            ev.progress(n + 1, len(convs), unit="conv", desc="tokenize")
    return kept, skipped


def length_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Indices grouped by length so that (longest * count) stays within batch_tokens."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and lengths[i] * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def pad_batch(seqs: list[list[int]], pad: int = 0) -> tuple[Tensor, Tensor]:
    """Right-padded ids [B,T] and attention mask [B,T] (padding on the right keeps positions)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    att = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, :len(s)] = torch.tensor(s, dtype=torch.long)
        att[r, :len(s)] = 1
    return ids, att


@dataclass
class ShardWriter:
    """Buffers samples and writes shard_NNNNN.safetensors files of about `shard_bytes` each."""

    out_dir: str
    dtype: torch.dtype
    shard_bytes: int
    shards: list[dict[str, Any]] = field(default_factory=list)
    _buf: list[tuple[str, Tensor, Tensor, Tensor, Tensor]] = field(default_factory=list)
    _bytes: int = 0

    def add(self, sid: str, ids: Tensor, mask: Tensor, aux: Tensor, hidden: Tensor) -> None:
        aux, hidden = aux.to("cpu", self.dtype), hidden.to("cpu", self.dtype)
        self._buf.append((sid, ids.to(torch.int32), mask.to(torch.uint8), aux, hidden))
        self._bytes += aux.nbytes + hidden.nbytes + ids.numel() * 5
        if self._bytes >= self.shard_bytes:
            self.flush()

    def flush(self) -> None:
        if not self._buf:
            return
        from safetensors.torch import save_file
        lens = [b[1].numel() for b in self._buf]
        offsets = torch.zeros(len(lens) + 1, dtype=torch.int64)
        offsets[1:] = torch.tensor(lens).cumsum(0)
        tensors = {
            "input_ids": torch.cat([b[1] for b in self._buf]),
            "loss_mask": torch.cat([b[2] for b in self._buf]),
            "offsets": offsets,
            "aux_hidden_states": torch.cat([b[3] for b in self._buf]).contiguous(),
            "hidden_states": torch.cat([b[4] for b in self._buf]).contiguous(),
        }
        name = f"shard_{len(self.shards):05d}.safetensors"
        save_file(tensors, os.path.join(self.out_dir, name),
                  metadata={"format": FORMAT, "ids": json.dumps([b[0] for b in self._buf])})
        self.shards.append({"file": name, "samples": len(lens), "tokens": int(sum(lens))})
        self._buf, self._bytes = [], 0


def prepare(target_dir: str, data_path: str, out_dir: str, max_len: int = 2048,
            batch_tokens: int = 16384, dtype: str | None = None, shard_mb: int = 1024,
            device: str | None = None, ev: Emitter | None = None, overwrite: bool = False,
            target: Target | None = None) -> dict[str, Any]:
    """Write DATA_DIR (module docstring) and return its manifest."""
    if os.path.exists(out_dir) and not overwrite:
        raise EngineError(f"{out_dir}: already exists (pass --overwrite to replace it)")
    if max_len < 4:
        raise EngineError(f"--max-len {max_len}: must be at least 4")
    convs = read_conversations(data_path)
    if target is None:
        target = Target.load(target_dir, device=device,
                             dtype=getattr(torch, dtype) if dtype else None)
    store = getattr(torch, dtype) if dtype else target.dtype
    samples, skipped = tokenize_all(target.tokenizer, convs, max_len, ev)
    if not samples:
        raise EngineError(f"{data_path}: no conversation has an assistant turn to learn from")
    start = time.monotonic()
    tmp = f"{out_dir.rstrip('/')}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        writer = ShardWriter(tmp, store, shard_mb << 20)
        lengths = [len(t.input_ids) for _, t in samples]
        done = 0
        for batch in length_batches(lengths, batch_tokens):
            ids, att = pad_batch([samples[i][1].input_ids for i in batch])
            aux, hidden = target.features(ids, att)
            for r, i in enumerate(batch):
                n = lengths[i]
                sid, t = samples[i]
                writer.add(sid, ids[r, :n], torch.tensor(t.loss_mask), aux[r, :n], hidden[r, :n])
            done += len(batch)
            if ev is not None:
                ev.progress(done, len(samples), unit="sample", desc="prepare")
        writer.flush()
        manifest = {
            "format": FORMAT, "version": VERSION,
            "samples": len(samples), "tokens": int(sum(lengths)),
            "loss_tokens": int(sum(sum(t.loss_mask) for _, t in samples)),
            "skipped": skipped, "max_len": max_len, "dtype": str(store).replace("torch.", ""),
            "aux_layer_ids": target.aux_layer_ids,
            "aux_layer_convention": "vllm: id k is the input of decoder layer k",
            "hidden_state": "final_norm",
            "target": {"path": os.path.abspath(target_dir),
                       "config_sha256": config_hash(target_dir),
                       "num_hidden_layers": target.num_layers, "hidden_size": target.hidden_size,
                       "vocab_size": int(target.model.config.vocab_size)},
            "source": {"path": os.path.abspath(data_path), "sha256": file_sha256(data_path)},
            "shards": writer.shards,
            "seconds": round(time.monotonic() - start, 3),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "engine": __version__,
        }
        with open(os.path.join(tmp, "manifest.json"), "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2)
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest
