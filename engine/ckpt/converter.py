"""Streaming checkpoint conversion: `python -m engine convert SRC DST --to STYLE` does this.

Tensor by tensor, in the source's on-disk order: with `--dtype keep` the stored bytes of a
safetensors source are copied by the kernel (sendfile, as `cp` does: never decoded, so identical,
and they never occupy Python memory); a dtype cast converts 8 MiB chunks; a `.bin` source (memory
mapped by torch.load) goes tensor by tensor (peak memory ~ the largest tensor). The sha256 of the
source weight files is computed on a thread while the copy runs (or taken from
engine/ckpt/hash_cache.py when this exact file was hashed before). Everything goes into a temp dir
beside DST that is renamed into place at the end; any failure removes it, so DST is complete or
absent (engine/ckpt/output_dir.py: also on SIGTERM, and stale temp dirs of killed runs are removed).
DST may not be SRC, lie inside it or contain it (nor contain or be the --embed-from target),
whatever symlinks lead there: with --force that would delete the source.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.ckpt.checks import export_checks, require_checks
from engine.ckpt.config_styles import to_eagle_dict, to_speculators_dict
from engine.ckpt.drafter_dir import Checkpoint, open_checkpoint
from engine.ckpt.drafter_save import (
    build_provenance,
    cast_code,
    config_for,
    identity_vocab_map,
    torch_name,
    write_json,
)
from engine.ckpt.hash_cache import HashInBackground
from engine.ckpt.key_map import LAYER_PREFIX, from_canonical, output_style
from engine.ckpt.output_dir import (
    atomic_output_dir,
    check_not_tied,
    check_replaceable,
)
from engine.ckpt.safetensors_io import (
    SafetensorsWriter,
    WeightSet,
    require_dir,
    tensor_bytes,
    torch_dtype,
)
from engine.ckpt.target_weights import target_embedding_entry
from engine.errors import EngineError
from engine.events import Emitter
from engine.fileio import read_json
from engine.inspect_report import training_origin
from engine.model.config import Eagle3Config

DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
AUX_CONVENTION = "vLLM: id k is the input of decoder layer k (HF hidden_states index k)"


@dataclass(frozen=True)
class _Item:
    """One output tensor and where its bytes come from."""

    out: str
    src: WeightSet
    name: str  # name in `src`
    in_code: str
    out_code: str
    shape: tuple[int, ...]


def _local_architectures(verifier: str) -> list[str] | None:
    """A verifier given as a local folder: the `architectures` of its config.json (what the
    speculators style records); None for a hub name or a folder without one."""
    path = Path(verifier).expanduser() / "config.json"
    if not path.is_file():
        return None
    archs = read_json(path).get("architectures")
    return [str(a) for a in archs] if isinstance(archs, list) else None


def convert_checkpoint(src: Path, dst: Path, to: str, *, verifier: str | None = None,
                       dtype: str = "keep", speculative_tokens: int = 3,
                       embed_from: Path | None = None, drop_embed: bool = False,
                       force: bool = False, ev: Emitter | None = None) -> dict[str, Any]:
    """Convert SRC (any style) into DST in the style `to`; returns a summary."""
    src, dst = Path(src), Path(dst)
    t0 = time.monotonic()
    dst = check_destination(src, dst, Path(embed_from) if embed_from else None)
    check_replaceable(dst, force)  # before any work: an existing DST that is not a drafter
    if dtype not in ("keep", *DTYPE_NAMES):
        raise EngineError(f"--dtype {dtype!r}: one of keep, bf16, fp16, fp32")
    ck = open_checkpoint(src)
    require_checks(ck)
    cfg = _output_config(ck, verifier, dtype, speculative_tokens)
    plan = _plan(ck, to, dtype, cfg, embed_from, drop_embed)
    items, embed_info = plan.items, plan.embed_info
    warnings = export_checks(cfg, plan.canonical_out, to)
    conf = config_for(cfg, to, verifier=verifier, speculative_tokens=speculative_tokens)

    total = sum(_nbytes(i) for i in items)
    hasher = HashInBackground(ck.weights.files)
    report = _progress(total, ev)
    log = (lambda m: ev.log(m, level="warning")) if ev else None
    with atomic_output_dir(dst, force=force, log=log) as tmp:
        _write_weights(tmp / "model.safetensors", items, report)
        write_json(tmp / "config.json", conf)
        sha = hasher.result()
        if embed_info is not None:
            embed_info["note"] = "the target file is not hashed (it can be very large)"
        prov = _provenance(ck, to, dtype, items, sha, plan.embed_action, embed_info, cfg,
                           warnings)
        write_json(tmp / "provenance.json", prov)
    for w in warnings:
        if ev:
            ev.log(w, level="warning")
    return {"src": str(src), "dst": str(dst), "to": to, "source_format": ck.detected.format,
            "tensors": len(items), "bytes": total, "seconds": round(time.monotonic() - t0, 3),
            "embed": plan.embed_action, "warnings": warnings}


def _output_config(ck: Checkpoint, verifier: str | None, dtype: str,
                   speculative_tokens: int) -> Eagle3Config:
    """The source's drafter config with what the conversion changes (verifier, dtype, K)."""
    cfg = ck.config.with_(speculative_tokens=speculative_tokens)
    if verifier:
        cfg.verifier = verifier
        cfg.verifier_architectures = _local_architectures(verifier) or cfg.verifier_architectures
    if dtype != "keep":
        cfg.torch_dtype = DTYPE_NAMES[dtype]
    return cfg


@dataclass
class _Plan:
    """The output tensors in write order, and what happens to the embedding."""

    items: list[_Item]
    canonical_out: list[str]
    embed_action: str
    embed_info: dict[str, Any] | None


def _plan(ck: Checkpoint, to: str, dtype: str, cfg: Eagle3Config, embed_from: Path | None,
          drop_embed: bool) -> _Plan:
    """Source tensors in file order (sequential reads), then the target's embedding."""
    style = output_style(to)
    files = {p: i for i, p in enumerate(ck.weights.files)}
    canon = sorted((c for c in ck.stored if not identity_vocab_map(cfg, c)),
                   key=lambda c: (files[ck.entry(c).file], ck.entry(c).offset))
    embed_action = "kept" if "embed_tokens.weight" in ck.stored else "absent"
    if drop_embed or embed_from:
        if "embed_tokens.weight" in canon:
            canon.remove("embed_tokens.weight")
        embed_action = "dropped" if drop_embed else "added from target"
    items = []
    for c in canon:
        e = ck.entry(c)
        items.append(_Item(from_canonical(c, style), ck.weights, e.name, e.dtype,
                           cast_code(e.dtype, dtype), e.shape))
    embed_info: dict[str, Any] | None = None
    if embed_from:
        tws, te = target_embedding_entry(Path(embed_from), cfg)
        items.append(_Item("embed_tokens.weight", tws, te.name, te.dtype,
                           cast_code(te.dtype, dtype), te.shape))
        embed_info = {"path": str(Path(embed_from).resolve()), "file": te.file.name,
                      "tensor": te.name, "file_size": te.file.stat().st_size}
    canonical_out = list(canon) + (["embed_tokens.weight"] if embed_from else [])
    return _Plan(items, canonical_out, embed_action, embed_info)


def _progress(total: int, ev: Emitter | None) -> Callable[[int], None]:
    """Progress in whole MiB (at least one unit): starts it, returns `report(bytes_done)`."""
    total_mib = max(1, -(-total // (1 << 20)))

    def report(done: int) -> None:
        if ev:
            mib = total_mib if done >= total else done * total_mib // max(total, 1)
            ev.progress(mib, total_mib, unit="MiB", desc="convert")

    if ev:
        ev.progress(0, total_mib, unit="MiB", desc="convert", force=True)
    return report


def _write_weights(path: Path, items: list[_Item], report: Callable[[int], None]) -> None:
    """model.safetensors: each item's bytes in order, reported as they are written."""
    specs = [(i.out, i.out_code, i.shape) for i in items]
    writer = SafetensorsWriter(path, specs)
    done = 0
    try:
        for it in items:
            base = done
            if it.in_code == it.out_code and it.src.kind == "safetensors":
                e = it.src.entries[it.name]  # same bytes: copy them in the kernel
                for n in writer.copy_from(it.out, e.file, e.offset, e.nbytes):
                    done = base + n
                    report(done)
                continue
            for chunk in _bytes_of(it):
                writer.write(it.out, chunk)
                done += len(chunk)
                report(done)
        writer.close()
    except BaseException:
        writer.abort()
        raise


def check_destination(src: Path, dst: Path, embed_from: Path | None = None) -> Path:
    """Refuse a DST that is, lies inside or contains SRC (or is or contains the --embed-from
    target), by resolved path and by (device, inode), so no symlink, `..` or bind mount hides
    the relation; returns DST with a usable name (`.` and `..` resolved)."""
    require_dir(src)  # one line for a missing source or a symlink loop
    inputs = [(src, f"the source {src}", True)]
    if embed_from is not None:
        require_dir(embed_from)
        inputs.append((embed_from, f"the --embed-from target {embed_from}", False))
    return check_not_tied(dst, inputs)


def _nbytes(it: _Item) -> int:
    n = torch_dtype(it.out_code).itemsize
    for s in it.shape:
        n *= s
    return n


def _bytes_of(it: _Item) -> Iterator[memoryview]:
    """The output bytes of one tensor: raw chunks when the dtype is kept, else cast chunk by
    chunk (safetensors) or tensor by tensor (.bin, already memory-mapped)."""
    if it.in_code == it.out_code:
        yield from it.src.raw_chunks(it.name)
        return
    src, out = torch_dtype(it.in_code), torch_dtype(it.out_code)
    if it.src.kind == "safetensors":
        # cast into one reused buffer, as the raw chunks come through one: a fresh tensor a
        # chunk left the peak to the allocator (45 MiB here most runs, 68 MiB in one)
        cast: torch.Tensor | None = None
        for chunk in it.src.raw_chunks(it.name):
            part = torch.frombuffer(chunk, dtype=src)
            if cast is None:
                cast = torch.empty(part.numel(), dtype=out)
            view = cast[:part.numel()]
            view.copy_(part)
            yield tensor_bytes(view)
        return
    yield tensor_bytes(it.src.load(it.name).to(out))


def _provenance(ck: Checkpoint, to: str, dtype: str, items: list[_Item],
                sha: dict[str, tuple[str, bool]],
                embed_action: str, embed_info: dict[str, Any] | None, cfg: Any,
                warnings: list[str]) -> dict[str, Any]:
    src_style, out_style = ck.detected.key_style, output_style(to)
    renamed = {i.name: i.out for i in items if i.src is ck.weights and i.name != i.out}
    return build_provenance(to, {
        "source": {
            "path": str(ck.path.resolve()),
            "format": ck.detected.format,
            "key_style": src_style,
            "config_style": ck.detected.config_style,
            "weight_files": {p.name: {"sha256": sha[p.name][0], "size": p.stat().st_size,
                                      "sha256_from": "cache" if sha[p.name][1] else "computed"}
                             for p in ck.weights.files},
        },
        "key_mapping": {
            "rule": f"{LAYER_PREFIX[src_style]}* -> {LAYER_PREFIX[out_style]}*",
            "renamed": renamed,
            "dropped": list(ck.ignored) + (["embed_tokens.weight"] if embed_action in (
                "dropped", "added from target") and "embed_tokens.weight" in ck.stored else []),
        },
        "dtype": {"requested": dtype,
                  "cast": {i.out: [torch_name(i.in_code), torch_name(i.out_code)]
                           for i in items if i.in_code != i.out_code}},
        "embedding": {"action": embed_action, "source": embed_info},
        "aux_layer_ids": {"value": cfg.aux_layer_ids,
                          "written": (to_speculators_dict(cfg) if out_style == "speculators"
                                      else to_eagle_dict(cfg)).get(
                              "eagle_aux_hidden_state_layer_ids") is not None,
                          "convention": AUX_CONVENTION},
        "warnings": warnings,
        # the run, step, held-out tau and hashes of the source's training, so inspect of the
        # conversion (and of a conversion of it) still tells best from final
        "origin": training_origin(ck.path),
    }, command=True)
