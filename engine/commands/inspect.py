"""`python -m engine inspect PATH [--json]`: what a drafter checkpoint is, and whether it is sound.

Prints the detected format, the provenance (what wrote it; the run, step and held-out tau; the
finetune source; the data and vocab hashes; what it was converted from), a table of tensors (name,
shape, dtype, bytes), the config summary (H, Ht, I, heads, head dim, V, Vd, aux layer ids, rope)
and checks with pass or fail: shapes agree with the config, the d2t/t2d invariant, embedding
present or absent, unknown keys. `--json` prints one object with `format` (the files' layout:
eagle, speculators or mixed), `style` (the export style its writer recorded, vllm or sglang for
eagle-format exports, else the format), `provenance`, `tensors`, `config`, `checks` (and `ok`).
Exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
from typing import Any

from engine.events import Emitter
from engine.inspect_report import read_provenance, render

HELP = "show a drafter checkpoint's format, tensors, config and checks (exit 1 on a failed check)"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="drafter directory")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def collect(path: str) -> dict[str, Any]:
    """The inspect report as plain data (raises EngineError when PATH cannot be read at all)."""
    from pathlib import Path

    from engine.ckpt.checks import run_checks
    from engine.ckpt.config_styles import NORM_FLAGS
    from engine.ckpt.drafter_dir import open_checkpoint
    from engine.ckpt.key_map import EXPORT_TARGETS, output_style
    from engine.model.config import MLA_FIELDS

    ck = open_checkpoint(Path(path))
    cfg = ck.config
    tensors = {e.name: {"shape": list(e.shape), "dtype": e.dtype, "bytes": e.nbytes,
                        "file": e.file.name} for e in ck.weights.entries.values()}
    checks = [c.to_json() for c in run_checks(ck)]
    aux: Any = cfg.aux_layer_ids
    if aux is None:
        aux = (cfg.resolved_aux_layer_ids() if cfg.target_num_layers
               else "defaults: 2, N//2, N-3 of the target")
    summary = {
        "hidden_size": cfg.hidden_size, "target_hidden_size": cfg.target_hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
        "vocab_size": cfg.vocab_size, "draft_vocab_size": cfg.draft_vocab_size,
        "aux_layer_ids": aux, "rope_theta": cfg.rope_theta, "rope_scaling": cfg.rope_scaling,
        "max_position_embeddings": cfg.max_position_embeddings, "torch_dtype": cfg.torch_dtype,
        "norm_before_residual": cfg.norm_before_residual,
        **{k: getattr(cfg, k) for k in NORM_FLAGS},  # EAGLE 3.1, as this engine runs them
        "verifier": cfg.verifier,
    }
    if cfg.layer_kind == "mla":  # the MLA sizes (engine/model/mla_layer.py)
        summary.update({k: getattr(cfg, k) for k in MLA_FIELDS})
    prov = read_provenance(ck.path)
    # vllm and sglang exports are eagle-format files: only the writer's record tells them apart
    written = (prov or {}).get("format")
    style = written if (written in EXPORT_TARGETS
                        and output_style(written) == ck.detected.format) else ck.detected.format
    return {"path": str(ck.path), "format": ck.detected.format, "style": style,
            "key_style": ck.detected.key_style, "config_style": ck.detected.config_style,
            "weights": ck.weights.kind, "files": [p.name for p in ck.weights.files],
            "tensors": tensors, "total_bytes": sum(t["bytes"] for t in tensors.values()),
            "config": summary, "checks": checks, "ok": all(c["ok"] for c in checks),
            "provenance": prov}


def run(args: argparse.Namespace, ev: Emitter) -> int:
    report = collect(args.path)
    ev.answer(report, args.json, render)
    return 0 if report["ok"] else 1
