"""Training data from conversations: chat template, loss mask, target features, safetensors shards.

`python -m engine prepare --target TARGET_DIR --data conv.jsonl --out DATA_DIR [--max-len 2048]`

Data directory format (version 1), read by engine/data/readers.py (train, eval) and by `vocab build
--data`:

    DATA_DIR/manifest.json
    DATA_DIR/shard_00000.safetensors, shard_00001.safetensors, ...

Each shard holds S samples concatenated along the token axis (no padding), N tokens in all:
    input_ids          int32  [N]        token ids (chat template applied)
    loss_mask          uint8  [N]        1 on assistant tokens (content and end-of-turn marker)
    offsets            int64  [S+1]      sample s is tokens offsets[s] .. offsets[s+1]-1
    aux_hidden_states  DTYPE  [N, 3*Ht]  inputs of the three aux decoder layers, low|mid|high
                                         (residual stream, not normalised)
    hidden_states      DTYPE  [N, Ht]    the target's final hidden state AFTER its final norm (the
                                         lm_head input); target logits = lm_head(hidden_states)
    target_argmax      int32  [N]        optional: the target's argmax over its full vocab,
                                         `target_argmax` (engine/model/ttt_loss.py) of hidden_states
                                         as stored (float32 logits); training computes it if absent
The shard's safetensors metadata carries `ids` (JSON list of the S conversation ids).
DTYPE is the manifest's `dtype` (float32 on CPU, the target's dtype on GPU by default), or with
`--fp8` float8_e4m3fn beside `aux_hidden_states_scale` [N, 3] and `hidden_states_scale` [N, 1]
(float32; manifest `storage` "float8_e4m3fn"; engine/data/fp8_store.py). Readers dequantise to
DTYPE; data without `storage` is full precision.

manifest.json:
    format "eagle3-console-data", version 1, samples, tokens, loss_tokens,
    skipped {no_assistant_tokens, template_error}, max_len, dtype, storage,
    aux_layer_ids (vLLM convention: id k = INPUT of decoder layer k), hidden_state "final_norm",
    target {path, config_sha256, num_hidden_layers, hidden_size, vocab_size},
    source {path, sha256}, shards [{file, samples, tokens}], created, engine.

The directory is written as DATA_DIR.partial and renamed when complete: a killed prepare leaves no
DATA_DIR behind, and the same command run again keeps the shards already there (`.plan.json` holds a
hash of everything they depend on; any change starts afresh). Samples are grouped by length for the
target's batches, so shard order is not the input order (training shuffles anyway).

Scale: the shard plan (which samples, in which batches, in which shard) is fixed from the token
counts before any forward pass. Under torchrun each rank loads its own target and writes shards
rank, rank + world, ...; rank 0 checks they are all there, writes the manifest and renames. The
directory is the same whatever the number of ranks, and a run killed at one world size resumes at
another. `--device-map auto` spreads a target too big for one GPU over the GPUs (per rank: its
share of the node's GPUs). Before writing, the estimated size (tokens x 4 states x hidden x dtype,
engine/data/disk_estimate.py) is checked against the free space.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from engine import __version__
from engine.ckpt.output_dir import DirKind, check_not_tied, check_replaceable, replace_refusal
from engine.ckpt.target_config import config_hash
from engine.data.chat import Tokenized, tokenize_conversation
from engine.data.conversations import Conversation, read_conversations
from engine.data.disk_estimate import TOKEN_EXTRA_BYTES, check_free_space, estimate_bytes
from engine.data.features import FORMAT
from engine.data.fp8_store import FP8_NAME, SCALE_SUFFIX, quantize, value_bytes
from engine.data.target import Target
from engine.dist import Dist, maybe_init_dist, shutdown
from engine.errors import EngineError
from engine.events import Emitter
from engine.fileio import atomic_file, read_json, replace_dir, sha256_file, write_json
from engine.model.ttt_loss import target_argmax

VERSION = 1


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
    """Buffers samples and writes shard_NNNNN.safetensors files of about `shard_bytes` each
    (or exactly the files named by `flush(name)`, when a shard plan decides the boundaries)."""

    out_dir: str
    dtype: torch.dtype
    shard_bytes: int
    shards: list[dict[str, Any]] = field(default_factory=list)
    head: Tensor | None = None
    """The target's lm_head [V,Ht]: when set, shards also hold `target_argmax`."""
    fp8: bool = False
    """Store the states as float8_e4m3fn with per-token scales (engine/data/fp8_store.py)."""
    _buf: list[tuple[str, Tensor, Tensor, Tensor, Tensor, Tensor | None]] = field(
        default_factory=list)
    _scales: list[tuple[Tensor, Tensor]] = field(default_factory=list)
    _bytes: int = 0

    def add(self, sid: str, ids: Tensor, mask: Tensor, aux: Tensor, hidden: Tensor) -> None:
        hidden = hidden.to(self.dtype)  # the argmax is taken from the hidden state as stored
        top = None if self.head is None else \
            target_argmax(hidden, self.head).to("cpu", torch.int32)  # (before any FP8 rounding)
        aux, hidden = aux.to("cpu", self.dtype), hidden.to("cpu")
        if self.fp8:
            (aux, sa), (hidden, sh) = quantize(aux, 3), quantize(hidden, 1)
            self._scales.append((sa, sh))
        self._buf.append((sid, ids.to(torch.int32), mask.to(torch.uint8), aux, hidden, top))
        self._bytes += aux.nbytes + hidden.nbytes + ids.numel() * (5 if top is None else 9)
        if self._bytes >= self.shard_bytes:
            self.flush()

    def flush(self, name: str | None = None) -> None:
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
        if self._scales:
            tensors["aux_hidden_states" + SCALE_SUFFIX] = torch.cat([s[0] for s in self._scales])
            tensors["hidden_states" + SCALE_SUFFIX] = torch.cat([s[1] for s in self._scales])
        tops = [b[5] for b in self._buf]
        if all(x is not None for x in tops):
            tensors["target_argmax"] = torch.cat(tops)  # type: ignore[arg-type]
        name = name or shard_name(len(self.shards))
        path = os.path.join(self.out_dir, name)  # a killed writer leaves no shard, and its part
        with atomic_file(path, os.path.join(self.out_dir, f".{name}.part")) as part:  # is reused
            save_file(tensors, str(part),
                      metadata={"format": FORMAT, "ids": json.dumps([b[0] for b in self._buf])})
        self.shards.append({"file": name, "samples": len(lens), "tokens": int(sum(lens))})
        self._buf, self._scales, self._bytes = [], [], 0


def shard_name(n: int) -> str:
    return f"shard_{n:05d}.safetensors"


def plan_shards(lengths: list[int], batches: list[list[int]], token_bytes: int,
                shard_bytes: int) -> list[list[list[int]]]:
    """Consecutive target batches grouped into shards of about `shard_bytes` (known from the
    token counts before any forward pass). Shard k is written whole by one process, so the
    directory comes out the same whatever the number of processes (torchrun ranks)."""
    shards: list[list[list[int]]] = []
    cur: list[list[int]] = []
    size = 0
    for b in batches:
        cur.append(b)
        size += sum(lengths[i] for i in b) * token_bytes
        if size >= shard_bytes:
            shards.append(cur)
            cur, size = [], 0
    if cur:
        shards.append(cur)
    return shards


def shard_layout(lengths: list[int], batch_tokens: int, hidden: int, store: torch.dtype,
                 shard_mb: float, fp8: bool = False) -> list[list[list[int]]]:
    """The shard plan both paths write (this module and engine/capture/vllm_capture.py): the
    --batch-tokens target batches (`length_batches`) grouped up to --shard-mb, sized by what a
    token takes in a shard (4 feature rows of `hidden` in `store` or FP8, plus its id and
    mask)."""
    width, scales = value_bytes(store, fp8)
    token_bytes = 4 * hidden * width + scales + 5
    return plan_shards(lengths, length_batches(lengths, batch_tokens), token_bytes,
                       max(1, int(shard_mb * (1 << 20))))


# What `--overwrite` may replace (engine/ckpt/output_dir.py): a data directory, or an empty one.
DATA_DIR = DirKind("prepared-data directory",
                   re.compile(r"manifest\.json|shard_\d{5,}\.safetensors"),
                   lambda names: "manifest.json" in names,
                   "manifest.json and shard_*.safetensors, nothing else", flag="--overwrite")

# What prepare may remove when it starts OUT.partial afresh: its own files, temp files included.
PARTIAL_DIR = DirKind("partial data directory",
                      re.compile(r"\.plan\.json|progress\.json|pending\.jsonl|manifest\.json|"
                                 r"shard_\d{5,}\.safetensors|\.shard_\d{5,}\.safetensors\.part|"
                                 r"\.[^/]+\.tmp-\d+-[0-9a-f]{8}"),
                      lambda names: True, "the shards of an unfinished prepare, nothing else")


def check_args(out_dir: str, overwrite: bool, max_len: int, shard_mb: float,
               concurrency: int | None = None, *, target_dir: str, data_path: str) -> None:
    """The refusals every path makes before reading anything (`concurrency`: --from-vllm's):
    OUT (and OUT.partial, where the work happens) is not, holds no and lies inside no input,
    and an existing OUT is replaced only when it is a data directory (or empty)."""
    inputs = [(Path(target_dir), f"the target {target_dir}", True),
              (Path(data_path), f"the data {data_path}", True)]
    for d in (out_dir, out_dir.rstrip("/") + ".partial"):
        check_not_tied(Path(d), inputs, flag="--overwrite", choose="--out")
    check_replaceable(Path(out_dir), overwrite, DATA_DIR)
    if max_len < 4:
        raise EngineError(f"--max-len {max_len}: must be at least 4")
    if concurrency is not None and concurrency < 1:
        raise EngineError(f"--concurrency {concurrency}: must be >= 1")
    if shard_mb <= 0:
        raise EngineError(f"--shard-mb {shard_mb}: must be positive")


def _agree(dist: Dist, fn: Any) -> Any:
    """Run `fn` on rank 0 and hand its result (or its EngineError, raised on every rank) to all
    ranks, so a refusal is one clean error everywhere instead of ranks hanging in a barrier."""
    res: Any = None
    err: str | None = None
    if dist.main:
        try:
            res = fn()
        except EngineError as e:
            err = str(e)
    res, err = dist.broadcast_object((res, err))  # type: ignore[misc]
    if err is not None:
        raise EngineError(err)
    return res


def check_disk(out_dir: str, tokens: int, hidden: int, store: torch.dtype,
               keep_free_gb: float = 0.0, fp8: bool = False) -> int:
    """Refuse before writing when the shards (tokens x 4 states x hidden x dtype) won't fit."""
    width, scales = value_bytes(store, fp8)
    need = estimate_bytes(tokens, 4, hidden, width, TOKEN_EXTRA_BYTES + scales)
    check_free_space(os.path.dirname(os.path.abspath(out_dir)) or ".", need,
                     int(keep_free_gb * 1e9),
                     what=f"{tokens} tokens x 4 states x {hidden} hidden x {width} bytes"
                     + (" (FP8) + scales" if fp8 else ""))
    return need


def write_manifest(tmp: str, manifest: dict[str, Any]) -> None:
    write_json(os.path.join(tmp, "manifest.json"), manifest)


def publish(tmp: str, out_dir: str) -> None:
    """The finished temporary directory becomes DATA_DIR in one rename (an old DATA_DIR is
    removed only once the new one is in place)."""
    replace_dir(Path(tmp), Path(out_dir.rstrip("/") or out_dir))


def finish(tmp: str, out_dir: str, manifest: dict[str, Any], *scratch: str) -> None:
    """Write the manifest, remove the resume bookkeeping files `scratch` and publish."""
    write_manifest(tmp, manifest)
    for name in scratch:
        os.remove(os.path.join(tmp, name))
    publish(tmp, out_dir)


def prepare(target_dir: str, data_path: str, out_dir: str, max_len: int = 2048,
            batch_tokens: int = 16384, dtype: str | None = None, shard_mb: float = 1024,
            device: str | None = None, ev: Emitter | None = None, overwrite: bool = False,
            target: Target | None = None, device_map: str | None = None,
            keep_free_gb: float = 0.0, fp8: bool = False) -> dict[str, Any]:
    """Write DATA_DIR (module docstring) and return its manifest. Under torchrun every rank loads
    its own replica (or, with device_map="auto", its share of the node's GPUs) and writes its
    round-robin share of the planned shards; rank 0 writes the manifest and publishes."""
    import torch.distributed as torch_dist
    owned = not torch_dist.is_initialized()  # a caller's process group is the caller's to end
    dist = maybe_init_dist(_dist_device(device, device_map))
    try:
        return _prepare(dist, target_dir, data_path, out_dir, max_len, batch_tokens, dtype,
                        shard_mb, device, ev if dist.main else None, overwrite, target,
                        device_map, keep_free_gb, fp8)
    finally:
        if owned:
            shutdown(dist)


def _dist_device(device: str | None, device_map: str | None) -> str | None:
    """The device for the process group: with a device map, the first GPU of this rank's share
    (cuda:LOCAL_RANK may belong to another rank's share)."""
    if device_map == "auto" and torch.cuda.is_available():
        from engine.data.target import local_gpus
        return f"cuda:{local_gpus()[0]}"
    return device


def _prepare(dist: Dist, target_dir: str, data_path: str, out_dir: str, max_len: int,
             batch_tokens: int, dtype: str | None, shard_mb: float, device: str | None,
             ev: Emitter | None, overwrite: bool, target: Target | None,
             device_map: str | None, keep_free_gb: float, fp8: bool = False) -> dict[str, Any]:
    check_args(out_dir, overwrite, max_len, shard_mb, target_dir=target_dir, data_path=data_path)
    convs = read_conversations(data_path)
    target, store = _load_target(target, target_dir, device, device_map, dtype, ev)
    samples, skipped = tokenize_all(target.tokenizer, convs, max_len, ev)
    if not samples:
        raise EngineError(f"{data_path}: no conversation has an assistant turn to learn from")
    lengths = [len(t.input_ids) for _, t in samples]
    plan = shard_layout(lengths, batch_tokens, target.hidden_size, store, shard_mb, fp8)
    key = plan_key(data_path, target_dir, target, store, max_len,
                   [[[samples[i][0] for i in b] for b in chunk] for chunk in plan], fp8)
    start = time.monotonic()
    tmp, have = _agree(dist, lambda: _open_checked(out_dir, key, plan, lengths,
                                                   target.hidden_size, store, keep_free_gb,
                                                   fp8))
    if have and ev is not None:
        ev.log(f"{out_dir}: resuming, {len(have)} of {len(plan)} shards already written")
    try:
        _write_shards(dist, tmp, plan, have, samples, lengths, target, store, ev, fp8)
        dist.barrier()  # every rank's shards are in place
        if dist.main:
            shards = _written_shards(tmp, plan, lengths)
            manifest = _manifest(target_dir, data_path, target, samples, skipped, max_len,
                                 store, shards, time.monotonic() - start)
            manifest["storage"] = FP8_NAME if fp8 else manifest["dtype"]
            finish(tmp, out_dir, manifest, PLAN_FILE)
        dist.barrier()
    except EngineError:
        if dist.main:  # bad input: nothing worth resuming
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    except BaseException:
        if dist.main and ev is not None:  # killed, interrupted, out of memory: keep the shards
            kept = sum(n.startswith("shard_") for n in os.listdir(tmp))
            ev.log(f"{tmp}: {kept} shard(s) kept; the same command resumes", level="warning")
        raise
    return _agree(dist, lambda: _read_manifest(out_dir))


def _load_target(target: Target | None, target_dir: str, device: str | None,
                 device_map: str | None, dtype: str | None, ev: Emitter | None
                 ) -> tuple[Target, torch.dtype]:
    """The target (loaded unless given) and the dtype the shards store."""
    if target is None:
        target = Target.load(target_dir, device=device, device_map=device_map,
                             dtype=getattr(torch, dtype) if dtype else None)
    store = getattr(torch, dtype) if dtype else target.dtype
    if device_map and ev is not None:
        devices = sorted(set(target.device_map.values()))
        ev.log(f"--device-map {device_map}: target on {', '.join(devices)}")
    return target, store


def _open_checked(out_dir: str, key: str, plan: list[list[list[int]]], lengths: list[int],
                  hidden: int, store: torch.dtype, keep_free_gb: float, fp8: bool = False
                  ) -> tuple[str, list[int]]:
    """OUT.partial and the shards it holds, once the shards still to write fit on its disk (a
    fresh OUT.partial that does not is removed again)."""
    tmp, have = _open_partial(out_dir, key, len(plan))
    left = sum(lengths[i] for k, chunk in enumerate(plan) if k not in have
               for b in chunk for i in b)
    try:  # only what is still to be written must fit
        check_disk(out_dir, left, hidden, store, keep_free_gb, fp8)
    except EngineError:
        if not have:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp, have


def _write_shards(dist: Dist, tmp: str, plan: list[list[list[int]]], have: list[int],
                  samples: list[tuple[str, Tokenized]], lengths: list[int], target: Target,
                  store: torch.dtype, ev: Emitter | None, fp8: bool = False) -> None:
    """This rank's round-robin share of the planned shards not yet in `tmp`."""
    mine = [k for k in range(dist.rank, len(plan), dist.world) if k not in have]
    total = sum(len(b) for k in mine for b in plan[k])
    writer = ShardWriter(tmp, store, 1 << 62,  # boundaries come from the plan
                         head=target.lm_head_weight().detach(), fp8=fp8)
    done = 0
    for k in mine:
        for batch in plan[k]:
            ids, att = pad_batch([samples[i][1].input_ids for i in batch])
            aux, hidden = target.features(ids, att)
            for r, i in enumerate(batch):
                n = lengths[i]
                sid, t = samples[i]
                writer.add(sid, ids[r, :n], torch.tensor(t.loss_mask), aux[r, :n],
                           hidden[r, :n])
            done += len(batch)
            if ev is not None:
                desc = "prepare" if dist.world == 1 else f"prepare (rank 0 of {dist.world})"
                ev.progress(done, total, unit="sample", desc=desc)
        writer.flush(shard_name(k))


def _written_shards(tmp: str, plan: list[list[list[int]]], lengths: list[int]
                    ) -> list[dict[str, Any]]:
    """The manifest's shard list, once every planned shard is in `tmp` (rank 0, after all)."""
    shards: list[dict[str, Any]] = [
        {"file": shard_name(k), "samples": sum(len(b) for b in chunk),
         "tokens": int(sum(lengths[i] for b in chunk for i in b))}
        for k, chunk in enumerate(plan)]
    missing = [s["file"] for s in shards if not os.path.isfile(os.path.join(tmp, s["file"]))]
    if missing:  # e.g. ranks on other nodes writing to a disk rank 0 does not see
        raise EngineError(f"{tmp}: shard {missing[0]} was not written (do all ranks "
                          "share the output filesystem?)")
    return shards


PLAN_FILE = ".plan.json"


def plan_key(data_path: str, target_dir: str, target: Target, store: torch.dtype, max_len: int,
             plan_ids: list[list[list[str]]], fp8: bool = False) -> str:
    """What a partial directory's shards depend on: source bytes, target config, dtype, device
    kind, aux ids and the shard plan (which covers --max-len, --batch-tokens and --shard-mb)."""
    what = [FORMAT, VERSION, sha256_file(data_path), config_hash(target_dir), str(store),
            target.device.type, target.aux_layer_ids, max_len, plan_ids, "target_argmax"]
    if fp8:  # (the old key otherwise: a partial directory of an older run still resumes)
        what.append(FP8_NAME)
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()


def _open_partial(out_dir: str, key: str, n_shards: int) -> tuple[str, list[int]]:
    """OUT.partial: kept (with the shards it already holds) when an earlier run with the same
    plan left it, otherwise started afresh. Shards appear there only complete (temp + rename)."""
    tmp = f"{out_dir.rstrip('/')}.partial"
    plan_path = os.path.join(tmp, PLAN_FILE)
    try:
        same = read_json(plan_path).get("key") == key
    except EngineError:
        same = False
    if not same:
        why = replace_refusal(Path(tmp), PARTIAL_DIR) if os.path.lexists(tmp) else None
        if why is not None:  # not ours to start afresh: a user's folder under that name
            raise EngineError(f"{tmp}: not removed, it {why} (prepare works in OUT.partial); "
                              "move it away or choose another --out")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        write_json(plan_path, {"key": key, "shards": n_shards})
    have = [k for k in range(n_shards) if os.path.isfile(os.path.join(tmp, shard_name(k)))]
    return tmp, have


def _read_manifest(out_dir: str) -> dict[str, Any]:
    return dict(read_json(os.path.join(out_dir, "manifest.json")))


def _manifest(target_dir: str, data_path: str, target: Target,
              samples: list[tuple[str, Tokenized]], skipped: dict[str, int], max_len: int,
              store: torch.dtype, shards: list[dict[str, Any]], seconds: float
              ) -> dict[str, Any]:
    return data_manifest(samples, skipped, max_len, store, target.aux_layer_ids,
                         target_dir=target_dir, config_sha256=config_hash(target_dir),
                         num_layers=target.num_layers, hidden=target.hidden_size,
                         vocab_size=int(target.model.config.vocab_size),
                         data_path=data_path, source_sha256=sha256_file(data_path),
                         shards=shards, seconds=seconds)


def data_manifest(samples: list[tuple[str, Tokenized]], skipped: dict[str, int], max_len: int,
                  store: torch.dtype, aux_ids: list[int], *, target_dir: str,
                  config_sha256: str, num_layers: int, hidden: int, vocab_size: int,
                  data_path: str, source_sha256: str, shards: list[dict[str, Any]],
                  seconds: float) -> dict[str, Any]:
    """manifest.json (module docstring), as both paths write it (--from-vllm adds `capture`)."""
    return {
        "format": FORMAT, "version": VERSION,
        "samples": len(samples), "tokens": int(sum(len(t.input_ids) for _, t in samples)),
        "loss_tokens": int(sum(sum(t.loss_mask) for _, t in samples)),
        "skipped": skipped, "max_len": max_len, "dtype": str(store).replace("torch.", ""),
        "storage": str(store).replace("torch.", ""),
        "aux_layer_ids": aux_ids,
        "aux_layer_convention": "vllm: id k is the input of decoder layer k",
        "hidden_state": "final_norm",
        "target": {"path": os.path.abspath(target_dir), "config_sha256": config_sha256,
                   "num_hidden_layers": num_layers, "hidden_size": hidden,
                   "vocab_size": vocab_size},
        "source": {"path": os.path.abspath(data_path), "sha256": source_sha256},
        "shards": shards,
        "seconds": round(seconds, 3),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "engine": __version__,
    }
