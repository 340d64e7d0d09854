"""Draft vocab maps (d2t: draft id -> offset to its target id; t2d: whether a target id is in
the draft vocab): build them from data, and re-index a drafter's lm_head.

Conventions (docs/eagle3.md#the-d2t-convention)
    d2t  int64 [Vd]  offsets: target_id = draft_id + d2t[draft_id]
    t2d  bool  [V]   true for target ids in the draft vocab;  nonzero(t2d) == d2t + arange(Vd)
    The draft vocab is the Vd ids with the most loss-masked occurrences (ties: lower id first),
    sorted ascending; ids that never occur fill up from the lowest unused id.
    A vocab file is a safetensors file holding `d2t` and `t2d` (metadata: coverage, sizes).

Data read by `count_tokens(DATA)` (what `vocab build --data` accepts)
    1. A JSONL file: one object per line, {"input_ids": [int, ...], "loss_mask": [0|1, ...]}
       of equal length; blank lines are skipped.
    2. A directory with `manifest.json` and safetensors shards (what `engine prepare` writes):
       - manifest.json: a JSON object; `shards` (a list of file names relative to the
         directory, or of objects {"file": name, ...}) when present, else every `*.safetensors`
         in the directory, sorted by name; the target vocab size from `vocab_size` or
         `target.vocab_size` when present.
       - each shard holds integer tensors `input_ids` and `loss_mask` of the same shape (any
         shape: packed [N] or padded [S, T] with loss_mask 0 on padding), and/or per-sample pairs
         named `<prefix>input_ids` / `<prefix>loss_mask` (e.g. `sample_7.input_ids`). Every other
         tensor in a shard (hidden states, ...) is ignored and never read.
    Token ids must lie in [0, V); loss_mask values must be 0 or 1.

Library entry points: count_tokens, build_vocab, coverage, save_vocab, load_vocab,
check_vocab_map, remap_lm_head, remap_drafter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from engine.ckpt.hash_cache import sha256_by_name
from engine.ckpt.safetensors_io import WeightSet, read_header, save_tensors
from engine.ckpt.target_weights import target_lm_head_rows
from engine.errors import EngineError
from engine.events import Emitter
from engine.fileio import atomic_file, json_line, read_json

MAX_VOCAB = 1 << 24
"""The largest target vocab the engine accepts (real ones reach about 262k). A vocab size read
from a file or an option is held to it before anything of that size is allocated: a manifest's
`vocab_size` of 2e9 would otherwise ask for 16 GB of counts."""


def check_vocab_size(v: Any, where: str) -> int:
    """`v` as a vocab size, or one line naming `where` it came from (file and field)."""
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise EngineError(f"{where}: {v!r} is not a positive integer")
    if v > MAX_VOCAB:
        raise EngineError(f"{where}: {v} is above the largest vocab size the engine accepts "
                          f"({MAX_VOCAB})")
    return v


# -- counting ------------------------------------------------------------------------------------


def count_tokens(data: Path, vocab_size: int | None = None, ev: Emitter | None = None
                 ) -> tuple[torch.Tensor, int]:
    """Loss-masked token counts [V] int64 and V (from the argument or the manifest)."""
    data = Path(data)
    if data.is_dir():
        return _count_shards(data, vocab_size, ev)
    if not data.is_file():
        raise EngineError(f"{data}: no such file or directory")
    if vocab_size is None:
        raise EngineError(f"{data}: the target vocab size is unknown (pass --vocab-size or "
                          "--target)")
    check_vocab_size(vocab_size, "--vocab-size")
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    with open(data, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{data}:{n}"
            obj = json_line(line, where)
            if not isinstance(obj, dict):
                raise EngineError(f"{where}: not a JSON object")
            ids, mask = obj.get("input_ids"), obj.get("loss_mask")
            for key, v in (("input_ids", ids), ("loss_mask", mask)):
                if not isinstance(v, list) or not all(isinstance(x, int) for x in v):
                    raise EngineError(f"{where}: field {key!r} missing or not a list of integers")
            _add(counts, torch.tensor(ids, dtype=torch.int64),
                 torch.tensor(mask, dtype=torch.int64), where)
            if ev and n % 1000 == 0:
                ev.progress(n, None, unit="lines", desc="count")
    return counts, vocab_size


def _add(counts: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, where: str) -> None:
    if ids.shape != mask.shape:
        raise EngineError(f"{where}: input_ids {list(ids.shape)} and loss_mask "
                          f"{list(mask.shape)} differ in shape")
    if ids.numel() == 0:
        return
    v = counts.numel()
    if bool(((ids < 0) | (ids >= v)).any()):
        bad = int(ids[(ids < 0) | (ids >= v)][0])
        raise EngineError(f"{where}: input_ids: token id {bad} outside the target vocab [0, {v})")
    if bool(((mask != 0) & (mask != 1)).any()):
        raise EngineError(f"{where}: loss_mask: values must be 0 or 1")
    counts += torch.bincount(ids[mask == 1].flatten(), minlength=v)


def _count_shards(d: Path, vocab_size: int | None, ev: Emitter | None
                  ) -> tuple[torch.Tensor, int]:
    mpath = d / "manifest.json"
    manifest = read_json(mpath, missing="missing (a data directory needs manifest.json)")
    if vocab_size is None:
        target = manifest.get("target")
        field = "vocab_size" if "vocab_size" in manifest else "target.vocab_size"
        vocab_size = manifest.get("vocab_size") or (
            target.get("vocab_size") if isinstance(target, dict) else None)
        if vocab_size is None:
            raise EngineError(f"{mpath}: field 'vocab_size' missing (or pass "
                              "--vocab-size/--target)")
        check_vocab_size(vocab_size, f"{mpath}: field {field!r}")
    check_vocab_size(vocab_size, "--vocab-size")
    names = manifest.get("shards")
    if names is None:
        shards = sorted(d.glob("*.safetensors"))
    elif isinstance(names, list):
        # entries are file names, or objects with a "file" field (what `engine prepare` writes)
        files = [n.get("file") if isinstance(n, dict) else n for n in names]
        names_ok = [f for f in files if isinstance(f, str)]
        if len(names_ok) != len(files):
            raise EngineError(f"{mpath}: field 'shards': entries must be file names or "
                              "objects with a 'file' name")
        shards = [d / f for f in names_ok]
    else:
        raise EngineError(f"{mpath}: field 'shards' is not a list")
    if not shards:
        raise EngineError(f"{d}: no *.safetensors shards")
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for i, path in enumerate(shards):
        if not path.is_file():
            raise EngineError(f"{mpath}: shard {path.name!r} does not exist")
        ws = open_weights_file(path)
        pairs = [n[: -len("input_ids")] for n in ws.entries if n.endswith("input_ids")]
        if not pairs:
            raise EngineError(f"{path}: no input_ids tensor")
        for prefix in pairs:
            mname = prefix + "loss_mask"
            if mname not in ws.entries:
                raise EngineError(f"{path}: tensor {prefix + 'input_ids'!r} has no {mname!r}")
            ids, mask = ws.load(prefix + "input_ids"), ws.load(mname)
            if ids.is_floating_point() or mask.is_floating_point():
                raise EngineError(f"{path}: tensor {prefix}input_ids/loss_mask must be integers")
            _add(counts, ids.long(), mask.long(), f"{path}: tensor {prefix + 'input_ids'!r}")
        if ev:
            ev.progress(i + 1, len(shards), unit="shards", desc="count")
    return counts, vocab_size


def open_weights_file(path: Path) -> WeightSet:
    """A WeightSet over one safetensors file (header fully validated)."""
    return WeightSet("safetensors", [path], read_header(path)[0])


# -- building and checking -----------------------------------------------------------------------


def build_vocab(counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The Vd most frequent ids (ties: lower id), sorted ascending -> (d2t, t2d)."""
    v = counts.numel()
    if not 0 < draft_vocab_size <= v:
        raise EngineError(f"--draft-vocab-size {draft_vocab_size}: must be in [1, {v}]")
    # Stable sort on -count keeps ascending id order among equal counts (including zero counts,
    # which fills a small vocab with the lowest unused ids).
    order = torch.sort(-counts, stable=True).indices
    chosen = order[:draft_vocab_size].sort().values
    d2t = chosen - torch.arange(draft_vocab_size)
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[chosen] = True
    return d2t, t2d


def coverage(counts: torch.Tensor, t2d: torch.Tensor) -> float:
    """Share of loss-masked tokens whose id is in the draft vocab."""
    total = int(counts.sum())
    return float(counts[t2d].sum()) / total if total else 0.0


def check_vocab_map(d2t: torch.Tensor, t2d: torch.Tensor | None, where: str,
                    vocab_size: int | None = None) -> None:
    """Raise unless d2t/t2d satisfy the invariant (docs/eagle3.md#the-d2t-convention)."""
    if d2t.dtype != torch.int64 or d2t.dim() != 1:
        raise EngineError(f"{where}: tensor 'd2t' must be int64 [Vd] (got {d2t.dtype} "
                          f"{list(d2t.shape)})")
    v = vocab_size if vocab_size is not None else (t2d.numel() if t2d is not None else None)
    targets = d2t + torch.arange(d2t.numel())
    if v is not None and bool(((targets < 0) | (targets >= v)).any()):
        raise EngineError(f"{where}: tensor 'd2t': target ids outside [0, {v})")
    if d2t.numel() > 1 and not bool((targets[1:] > targets[:-1]).all()):
        raise EngineError(f"{where}: tensor 'd2t': target ids not strictly ascending")
    if t2d is not None:
        if t2d.dtype != torch.bool or (v is not None and t2d.shape != (v,)):
            raise EngineError(f"{where}: tensor 't2d' must be bool [{v}] (got {t2d.dtype} "
                              f"{list(t2d.shape)})")
        if not torch.equal(t2d.nonzero().flatten(), targets):
            raise EngineError(f"{where}: nonzero(t2d) != d2t + arange(Vd)")


def save_vocab(path: Path, d2t: torch.Tensor, t2d: torch.Tensor,
               metadata: dict[str, Any] | None = None) -> None:
    """Write a vocab file atomically (temp file beside it, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: json.dumps(v) if not isinstance(v, str) else v for k, v in (metadata or {}).items()}
    with atomic_file(path) as tmp:
        save_tensors(tmp, {"d2t": d2t.contiguous(), "t2d": t2d.contiguous()}, meta)


def load_vocab(path: Path, vocab_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Read and validate a vocab file -> (d2t, t2d)."""
    path = Path(path)
    if not path.is_file():
        raise EngineError(f"{path}: no such vocab file")
    ws = open_weights_file(path)
    for name in ("d2t", "t2d"):
        if name not in ws.entries:
            raise EngineError(f"{path}: tensor {name!r} missing")
    d2t, t2d = ws.load("d2t"), ws.load("t2d")
    check_vocab_map(d2t, t2d, str(path), vocab_size)
    return d2t, t2d


# -- lm_head re-indexing -------------------------------------------------------------------------


def remap_lm_head(lm_head: torch.Tensor, old_d2t: torch.Tensor, new_d2t: torch.Tensor,
                  vocab_size: int, target_rows: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, dict[str, int]]:
    """lm_head [Vd_old, H] -> [Vd_new, H]: rows of tokens in both vocabs move exactly; rows new to
    the draft vocab come from `target_rows` [n_new, H] (the target's lm_head rows for the new
    tokens, in ascending target-id order) or else the mean of the kept rows."""
    old_t = old_d2t + torch.arange(old_d2t.numel())  # target id of each old row
    new_t = new_d2t + torch.arange(new_d2t.numel())
    pos = torch.full((vocab_size,), -1, dtype=torch.int64)
    pos[old_t] = torch.arange(old_t.numel())
    src = pos[new_t]  # old row of each new row, -1 when the token is new
    kept = src >= 0
    out = torch.empty(new_t.numel(), lm_head.shape[1], dtype=lm_head.dtype)
    out[kept] = lm_head[src[kept]]
    n_new = int((~kept).sum())
    if n_new:
        if target_rows is not None:
            if tuple(target_rows.shape) != (n_new, lm_head.shape[1]):
                raise EngineError(f"target lm_head rows {list(target_rows.shape)} do not fit "
                                  f"[{n_new}, {lm_head.shape[1]}]")
            out[~kept] = target_rows.to(lm_head.dtype)
        else:
            base = lm_head[src[kept]] if bool(kept.any()) else lm_head
            out[~kept] = base.float().mean(0).to(lm_head.dtype)
    stats = {"kept": int(kept.sum()), "new": n_new, "dropped": old_t.numel() - int(kept.sum()),
             "old_size": old_t.numel(), "new_size": new_t.numel()}
    return out, stats


def new_token_ids(old_d2t: torch.Tensor, new_d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Target ids in the new draft vocab but not in the old one, ascending."""
    old = torch.zeros(vocab_size, dtype=torch.bool)
    old[old_d2t + torch.arange(old_d2t.numel())] = True
    new_t = new_d2t + torch.arange(new_d2t.numel())
    return new_t[~old[new_t]]


def remap_drafter(ckpt: Path, vocab: Path, dst: Path, target: Path | None = None,
                  force: bool = False) -> dict[str, Any]:
    """`vocab remap`: a copy of the drafter with the new vocab and a re-indexed lm_head."""
    from engine.ckpt.checks import load_drafter
    from engine.ckpt.drafter_dir import open_checkpoint
    from engine.ckpt.drafter_save import save_drafter

    cfg, sd, det = load_drafter(ckpt)
    new_d2t, new_t2d = load_vocab(vocab, cfg.vocab_size)
    old_d2t = sd.get("d2t", torch.zeros(cfg.draft_vocab_size or 0, dtype=torch.int64))
    new_ids = new_token_ids(old_d2t, new_d2t, cfg.vocab_size)
    rows, source = None, "mean of kept rows"
    if target is not None:
        rows, source = target_lm_head_rows(target, new_ids, cfg.hidden_size)
        source = f"target {Path(target).resolve()} ({source})"
    head, stats = remap_lm_head(sd["lm_head.weight"], old_d2t, new_d2t, cfg.vocab_size, rows)
    sd["lm_head.weight"], sd["d2t"], sd["t2d"] = head, new_d2t, new_t2d
    new_cfg = cfg.with_(draft_vocab_size=new_d2t.numel())
    style = det.config_style if det.format == "mixed" else det.format
    files = open_checkpoint(Path(ckpt)).weights.files
    overlap = stats["kept"] / stats["new_size"] if stats["new_size"] else 0.0
    digests = sha256_by_name(files)
    prov = {"source": {"path": str(Path(ckpt).resolve()), "format": det.format,
                       "weight_files": {n: {"sha256": d} for n, d in digests.items()}},
            "vocab": {"path": str(Path(vocab).resolve()),
                      "sha256": sha256_by_name([Path(vocab)])[Path(vocab).name]},
            "remap": {**stats, "overlap": round(overlap, 6), "new_rows_from": source}}
    save_drafter(dst, new_cfg, sd, style, force=force, provenance=prov)
    return {"dst": str(dst), "style": style, **stats, "overlap": overlap,
            "new_rows_from": source}
