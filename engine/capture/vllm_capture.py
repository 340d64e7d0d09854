"""`engine prepare --from-vllm URL`: the data directory captured through a running vLLM server.

    python -m engine prepare --target T --data conv.jsonl --out DATA --from-vllm http://127.0.0.1:8000
        [--model NAME] [--concurrency 16] [--keep-server-files] [--max-failures 10]

The output is the transformers path's data directory (engine/data/prepare.py: manifest v1 + shards),
sample for sample: the same tokenisation, chat template and loss masks (`tokenize_all`), the same
sample order (stable sort by length) and shard boundaries (`ShardWriter`), features that mean the
same (engine/capture/vllm_client.py applies the final norm), plus a `capture` entry in the manifest.
Only the target's config, tokenizer and final-norm weight are read here; the server (started by
`python -m engine capture-server`) holds the model, e.g. with tensor parallelism.

Shard boundaries follow the transformers path's plan (`shard_plan`: its --batch-tokens target
batches grouped up to --shard-mb, known from the token counts). Requests go out in that order with
at most `concurrency` in flight and at most 2 x concurrency samples ahead of the oldest unwritten
one (memory stays bounded); results are written strictly in order, so the directory does not
depend on timing.

Resume: the work happens in OUT.partial/. `progress.json` (rewritten atomically after every
shard) records the arguments and the shards written; `pending.jsonl` records each server file
received but not yet in a shard. A run killed (or aborted because the server died) and started
again with the same arguments keeps the shards, reads the server files it was already told about,
and requests only the remaining samples; the finished directory equals an uninterrupted run's.
Other arguments on a partial directory are refused, naming the one that differs.

Server files (and their .lock) are deleted once a written shard holds their sample, unless
--keep-server-files; a run killed between recording a shard and deleting its files leaves them
in pending.jsonl, and the resumed run deletes them first. Only files inside --server-storage
(the capture server's --storage) are ever read or deleted, whatever the server's answer or
pending.jsonl names, and a file that failed its checks is left in place (asked for again).
Before anything is requested, the output size is estimated and the run refused when OUT's
filesystem cannot hold it (engine/data/disk_estimate.py, also --keep-free-gb).
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from engine.capture.vllm_client import (
    DaemonPool,
    FeatureSpec,
    ServerStorage,
    VllmClient,
    read_features,
)
from engine.ckpt.target_config import config_dtype, config_hash
from engine.data.chat import Tokenized
from engine.data.conversations import read_conversations
from engine.data.disk_estimate import human
from engine.data.fp8_store import FP8_NAME
from engine.data.prepare import (
    ShardWriter,
    check_args,
    check_disk,
    data_manifest,
    finish,
    shard_layout,
    tokenize_all,
)
from engine.data.target import default_aux_ids, load_tokenizer, read_config
from engine.errors import EngineError
from engine.events import Emitter
from engine.fileio import read_json, sha256_file, write_json, write_text

PROGRESS_FORMAT = "eagle3-console-capture-progress"


def stored_dtype(cfg: dict[str, Any], dtype: str | None) -> torch.dtype:
    """--dtype, else the target's own dtype (what vLLM serves and writes)."""
    name = dtype or config_dtype(cfg) or "bfloat16"
    dt = getattr(torch, name.replace("torch.", ""), None)
    return dt if isinstance(dt, torch.dtype) and dt.is_floating_point else torch.bfloat16


def canonical_order(samples: list[tuple[str, Tokenized]]) -> list[int]:
    """The transformers path's write order: a stable sort by length (prepare.length_batches)."""
    return sorted(range(len(samples)), key=lambda i: len(samples[i][1].input_ids))


def shard_plan(lengths: list[int], batch_tokens: int, hidden: int, store: torch.dtype,
               shard_mb: float, fp8: bool = False) -> list[int]:
    """Samples per shard, in the canonical order: the transformers path's plan (prepare.py
    `shard_layout`: its target batches grouped in order up to --shard-mb), so both paths cut
    the same shards."""
    return [sum(len(b) for b in chunk)
            for chunk in shard_layout(lengths, batch_tokens, hidden, store, shard_mb, fp8)]


@dataclass
class _Writer(ShardWriter):
    """ShardWriter that reports each flushed shard (progress journal, server-file cleanup)."""

    on_flush: Callable[[], None] | None = None

    def flush(self, *name: str | None) -> None:
        had = bool(self._buf)
        super().flush(*name)
        if had and self.on_flush is not None:
            self.on_flush()


def _read_pending(path: str) -> dict[int, tuple[str, str]]:
    """pos -> (sample id, server file) from the journal; a torn last line is ignored."""
    out: dict[int, tuple[str, str]] = {}
    if not os.path.isfile(path):
        return out
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                e = json.loads(line)
                out[int(e["pos"])] = (str(e["id"]), str(e["path"]))
            except (ValueError, KeyError, TypeError):
                break
    return out


class _Journal:
    """pending.jsonl: server files received but not yet in a written shard (thread-safe). It
    holds its own entries: a worker records a file before the main thread sees the result."""

    def __init__(self, path: str, entries: dict[int, tuple[str, str]]) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._entries = dict(entries)
        self._f = self._rewrite()

    def _rewrite(self) -> Any:
        write_text(self.path, "".join(
            json.dumps({"pos": p, "id": self._entries[p][0], "path": self._entries[p][1]}) + "\n"
            for p in sorted(self._entries)))
        return open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())

    def add(self, pos: int, sid: str, server_file: str) -> None:
        with self._lock:
            if self._f.closed:
                return
            self._entries[pos] = (sid, server_file)
            self._f.write(json.dumps({"pos": pos, "id": sid, "path": server_file}) + "\n")
            self._f.flush()

    def drop_below(self, pos: int) -> None:
        """Forget the samples before `pos`: written shards hold them."""
        with self._lock:
            self._entries = {p: v for p, v in self._entries.items() if p >= pos}
            self._f.close()
            self._f = self._rewrite()

    def close(self) -> None:
        with self._lock:
            self._f.close()


def resume_state(partial: str, fp: dict[str, Any]) -> list[dict[str, Any]]:
    """The shards a previous run with the same arguments wrote (empty for a fresh start)."""
    ppath = os.path.join(partial, "progress.json")
    if not os.path.isdir(partial):
        return []
    try:
        prog = read_json(ppath, obj=False)
    except EngineError:
        raise EngineError(f"{partial}: exists but holds no capture in progress (no readable "
                          "progress.json); remove it to start over") from None
    if not isinstance(prog, dict) or prog.get("format") != PROGRESS_FORMAT:
        raise EngineError(f"{ppath}: field 'format': expected {PROGRESS_FORMAT!r}")
    old = prog.get("args", {})
    for k in sorted(set(fp) | set(old)):
        if old.get(k) != fp.get(k):
            raise EngineError(f"{partial}: a capture started with other arguments ({k}: "
                              f"{old.get(k)!r} then, {fp.get(k)!r} now); rerun it with those, "
                              "or delete the directory to start over")
    shards = list(prog.get("shards", []))
    for s in shards:
        if not os.path.isfile(os.path.join(partial, str(s.get("file")))):
            raise EngineError(f"{ppath}: shard {s.get('file')!r} is missing; delete {partial} "
                              "to start over")
    if shards != [] and [int(s["samples"]) for s in shards] != fp["shard_plan"][:len(shards)]:
        raise EngineError(f"{partial}: its shards do not follow the plan; delete it to start over")
    return shards


@dataclass
class CapturePlan:
    """What both vLLM paths settle before asking for anything: the samples in the transformers
    path's order and shard plan, the resume state of OUT.partial, the disk estimate."""

    target_dir: str
    data_path: str
    max_len: int
    cfg: dict[str, Any]
    samples: list[tuple[str, Tokenized]]
    skipped: dict[str, int]
    store: torch.dtype
    aux_ids: list[int]
    order: list[int]
    plan: list[int]
    partial: str
    fp: dict[str, Any]
    shards: list[dict[str, Any]]
    need: int
    spec: FeatureSpec
    committed: int   # samples already in OUT.partial's shards
    left: int        # tokens still to capture (only these must fit on the disk)

    def manifest(self, shards: list[dict[str, Any]], seconds: float,
                 capture: dict[str, Any]) -> dict[str, Any]:
        m = data_manifest(self.samples, self.skipped, self.max_len, self.store, self.aux_ids,
                          target_dir=self.target_dir,
                          config_sha256=self.fp["target_config_sha256"],
                          num_layers=int(self.cfg["num_hidden_layers"]),
                          hidden=int(self.cfg["hidden_size"]),
                          vocab_size=int(self.cfg["vocab_size"]), data_path=self.data_path,
                          source_sha256=self.fp["source_sha256"], shards=shards,
                          seconds=seconds)
        if self.fp.get("fp8"):
            m["storage"] = FP8_NAME
        m["capture"] = {**capture, "layer_ids": self.spec.layer_ids,
                        "tokens_per_s": round(self.left / seconds, 1) if seconds > 0 else None}
        return m


def plan_capture(target_dir: str, data_path: str, out_dir: str | None, max_len: int,
                 dtype: str | None, shard_mb: float, batch_tokens: int, keep_free_gb: float,
                 ev: Emitter | None, **fingerprint: Any) -> CapturePlan:
    """Tokenise, order and plan the samples, pick up OUT.partial and refuse what won't fit.
    `fingerprint`: more arguments a partial directory must have been started with (`fp8`: the
    states are stored as FP8, engine/data/fp8_store.py). No `out_dir` (a stream): nothing on
    the disk to resume or to fit."""
    fp8 = bool(fingerprint.get("fp8"))
    cfg = read_config(target_dir)
    samples, skipped = tokenize_all(load_tokenizer(target_dir), read_conversations(data_path),
                                    max_len, ev)
    if not samples:
        raise EngineError(f"{data_path}: no conversation has an assistant turn to learn from")
    store = stored_dtype(cfg, dtype)
    hidden = int(cfg["hidden_size"])
    aux_ids = default_aux_ids(int(cfg["num_hidden_layers"]))
    order = canonical_order(samples)
    lengths = [len(samples[i][1].input_ids) for i in order]
    plan = shard_plan(lengths, batch_tokens, hidden, store, shard_mb, fp8)
    partial = out_dir.rstrip("/") + ".partial" if out_dir is not None else ""
    fp: dict[str, Any] = {
        "target_config_sha256": config_hash(target_dir), "source_sha256": sha256_file(data_path),
        "samples": len(samples), "max_len": max_len, "dtype": str(store).replace("torch.", ""),
        "shard_plan": plan, "aux_layer_ids": aux_ids, **fingerprint}
    shards = resume_state(partial, fp) if out_dir is not None else []
    committed = sum(int(s["samples"]) for s in shards)
    left = sum(lengths[committed:])
    need = check_disk(out_dir, left, hidden, store, keep_free_gb, fp8) if out_dir is not None \
        else 0
    return CapturePlan(target_dir, data_path, max_len, cfg, samples, skipped, store, aux_ids,
                       order, plan, partial, fp, shards, need,
                       FeatureSpec.for_target(target_dir, cfg, aux_ids), committed, left)


def prepare_from_vllm(target_dir: str, data_path: str, out_dir: str, url: str,
                      model: str | None = None, concurrency: int = 16, max_len: int = 2048,
                      dtype: str | None = None, shard_mb: float = 1024,
                      keep_server_files: bool = False, max_failures: int = 10,
                      ev: Emitter | None = None, overwrite: bool = False,
                      backoff: float = 0.2, batch_tokens: int = 16384,
                      keep_free_gb: float = 0.0, server_storage: str | None = None,
                      fp8: bool = False) -> dict[str, Any]:
    """Write DATA_DIR from the server at `url` (module docstring); returns the manifest."""
    check_args(out_dir, overwrite, max_len, shard_mb, concurrency, target_dir=target_dir,
               data_path=data_path)
    storage = ServerStorage(server_storage) if server_storage else ServerStorage()
    client = VllmClient(url, model, max_failures=max_failures, backoff=backoff, storage=storage)
    cp = plan_capture(target_dir, data_path, out_dir, max_len, dtype, shard_mb, batch_tokens,
                      keep_free_gb, ev, **({"fp8": True} if fp8 else {}))
    model_name = client.served_model()
    cap = _Capture(client, cp.spec, cp.samples, cp.order, cp.plan, cp.partial, cp.fp,
                   cp.shards, cp.store, keep_server_files, ev)
    pool = DaemonPool(concurrency, "capture")
    start = time.monotonic()
    total, committed = len(cp.samples), cp.committed
    if ev is not None:
        ev.log(f"capturing {total - committed} of {total} samples ({cp.left} tokens, about "
               f"{human(cp.need)}) from {client.root} (model {model_name}, layer ids "
               f"{cp.spec.layer_ids})"
               + (f"; {committed} already in {cp.partial}" if committed else ""))
        ev.progress(committed, total, unit="sample", desc="capture", force=True)
    cap.run(pool, concurrency, ev)
    manifest = cp.manifest(cap.writer.shards, time.monotonic() - start,
                           {"via": "vllm", "model": model_name})
    finish(cp.partial, out_dir, manifest, "progress.json", "pending.jsonl")
    return manifest


class _Capture:
    """One capture into OUT.partial: requests in the canonical order, results written strictly
    in order, each shard recorded in progress.json before its server files are freed."""

    def __init__(self, client: VllmClient, spec: FeatureSpec,
                 samples: list[tuple[str, Tokenized]], order: list[int], plan: list[int],
                 partial: str, fp: dict[str, Any], shards: list[dict[str, Any]],
                 store: torch.dtype, keep_server_files: bool, ev: Emitter | None = None) -> None:
        self.ev = ev
        self.client, self.spec, self.samples, self.order = client, spec, samples, order
        self.plan, self.fp, self.partial = plan, fp, partial
        self.keep_server_files = keep_server_files
        self.committed = sum(int(s["samples"]) for s in shards)
        os.makedirs(partial, exist_ok=True)
        self.ppath = os.path.join(partial, "progress.json")
        self.jpath = os.path.join(partial, "pending.jsonl")
        if not shards:
            self.save_progress([])
        self.known = self._reusable()
        self.paths: dict[int, str] = {}  # pos -> server file, until a written shard holds it
        self.journal = _Journal(self.jpath, self.known)
        self.added = self.cleaned = self.committed
        self.writer = _Writer(partial, store, 1 << 62, shards=list(shards),
                              on_flush=self.on_flush, fp8=bool(fp.get("fp8")))

    def save_progress(self, done_shards: list[dict[str, Any]]) -> None:
        write_json(self.ppath, {"format": PROGRESS_FORMAT, "args": self.fp,
                                "layer_ids": self.spec.layer_ids, "shards": done_shards})

    def _reusable(self) -> dict[int, tuple[str, str]]:
        """The journal's server files still to be written (a kill after a shard was recorded,
        before its files were freed: those are freed now). A path outside the storage (a
        journal from another server, or edited) is neither read nor deleted."""
        pending = _read_pending(self.jpath)
        storage = self.client.storage
        for p, (_sid, server_file) in sorted(pending.items()):
            if not storage.holds(server_file):
                if self.ev is not None:
                    self.ev.log(f"{self.jpath}: {server_file} is not inside the capture storage "
                                f"directory {storage.given}: left alone (sample asked for again)",
                                level="warning")
            elif p < self.committed:
                storage.remove(server_file, self.keep_server_files)
        return {p: v for p, v in pending.items() if p >= self.committed
                and v[0] == self.samples[self.order[p]][0] and storage.holds(v[1])
                and os.path.exists(v[1])}

    def fetch(self, pos: int) -> tuple[int, str, Tensor, Tensor]:
        sid, t = self.samples[self.order[pos]]
        old = self.known.pop(pos, None)
        if old is not None:  # received before a kill: read it instead of asking again
            try:
                return (pos, old[1], *read_features(old[1], sid, t.input_ids, self.spec))
            except EngineError:
                pass  # failed its checks: left as it is, the sample is asked for again
        path = self.client.request(sid, t.input_ids)
        self.journal.add(pos, sid, path)  # before reading: a kill now still leaves it reusable
        return (pos, path, *read_features(path, sid, t.input_ids, self.spec))

    def on_flush(self) -> None:  # a shard is on disk: record it, free the server's files, and
        # only then forget them (a kill in between: the resume frees them)
        self.save_progress(self.writer.shards)
        for p in range(self.cleaned, self.added):
            self.client.storage.remove(self.paths.pop(p), self.keep_server_files)
        self.journal.drop_below(self.added)
        self.cleaned = self.added

    def run(self, pool: DaemonPool, concurrency: int, ev: Emitter | None) -> None:
        """Every sample not yet in a shard: at most `concurrency` requests in flight and 2 x
        concurrency samples ahead of the oldest unwritten one."""
        total = len(self.samples)
        ends = set(itertools.accumulate(self.plan))  # shard boundaries come from the plan
        inflight: dict[Future[Any], int] = {}
        ready: dict[int, tuple[Tensor, Tensor]] = {}
        nxt = self.committed
        try:
            while self.added < total:
                while (nxt < total and len(inflight) < concurrency
                       and nxt - self.added < 2 * concurrency):
                    inflight[pool.submit(self.fetch, nxt)] = nxt
                    nxt += 1
                done, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
                for fut in done:
                    del inflight[fut]
                    pos, path, aux, hid = fut.result()  # an EngineError aborts the run here
                    self.paths[pos] = path
                    ready[pos] = (aux, hid)
                self._write_ready(ready, ends, ev)
            self.writer.flush()  # no-op: the last planned shard is written
        except BaseException as e:
            self.client.stopped.set()
            for fut in inflight:
                fut.cancel()
            pool.close(wait=True)  # the stopped client ends them after their current request
            self.journal.close()
            if isinstance(e, EngineError):
                kept = sum(int(x["samples"]) for x in self.writer.shards)
                raise EngineError(f"{e} ({kept} of {total} samples kept in {self.partial}; "
                                  "rerun the same command to resume)") from None
            raise
        pool.close(wait=True)
        self.journal.close()

    def _write_ready(self, ready: dict[int, tuple[Tensor, Tensor]], ends: set[int],
                     ev: Emitter | None) -> None:
        """Write the received samples that are next in order, flushing at planned ends."""
        total = len(self.samples)
        while self.added in ready:
            aux, hid = ready.pop(self.added)
            sid, t = self.samples[self.order[self.added]]
            self.added += 1  # before the flush: on_flush frees the files up to `added`
            self.writer.add(sid, torch.tensor(t.input_ids), torch.tensor(t.loss_mask), aux, hid)
            if self.added in ends:
                self.writer.flush()
            if ev is not None:
                ev.progress(self.added, total, unit="sample", desc="capture")
