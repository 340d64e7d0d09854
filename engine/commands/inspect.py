"""`python -m engine inspect PATH [--json]`: what a drafter checkpoint is, and whether it is sound.

Prints the detected format, a table of tensors (name, shape, dtype, bytes), the config summary
(H, Ht, I, heads, head dim, V, Vd, aux layer ids, rope) and checks with pass or fail: shapes agree
with the config, the d2t/t2d invariant, embedding present or absent, unknown keys. `--json` prints
one object with `format`, `tensors`, `config`, `checks` (and `ok`). Exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
from typing import Any

from engine.events import Emitter

HELP = "show a drafter checkpoint's format, tensors, config and checks (exit 1 on a failed check)"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="drafter directory")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def collect(path: str) -> dict[str, Any]:
    """The inspect report as plain data (raises EngineError when PATH cannot be read at all)."""
    from pathlib import Path

    from engine.checks import run_checks
    from engine.drafter_dir import open_checkpoint

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
        "verifier": cfg.verifier,
    }
    return {"path": str(ck.path), "format": ck.detected.format,
            "key_style": ck.detected.key_style, "config_style": ck.detected.config_style,
            "weights": ck.weights.kind, "files": [p.name for p in ck.weights.files],
            "tensors": tensors, "total_bytes": sum(t["bytes"] for t in tensors.values()),
            "config": summary, "checks": checks, "ok": all(c["ok"] for c in checks)}


def render(r: dict[str, Any]) -> str:
    lines = [f"{r['path']}: {r['format']} format (names {r['key_style']}, config "
             f"{r['config_style']}, {r['weights']}: {', '.join(r['files'])})", ""]
    w = max([len(n) for n in r["tensors"]] + [6])
    lines.append(f"{'tensor':<{w}}  {'shape':<16} {'dtype':<6} {'bytes':>14}")
    for name, t in sorted(r["tensors"].items()):
        shape = "x".join(map(str, t["shape"])) or "scalar"
        lines.append(f"{name:<{w}}  {shape:<16} {t['dtype']:<6} {t['bytes']:>14,}")
    lines.append(f"{'total':<{w}}  {'':<16} {'':<6} {r['total_bytes']:>14,}")
    c = r["config"]
    rope = c["rope_scaling"]["rope_type"] if c["rope_scaling"] else "default"
    lines += ["", f"H {c['hidden_size']}  Ht {c['target_hidden_size']}  I "
              f"{c['intermediate_size']}  heads {c['num_attention_heads']}/"
              f"{c['num_key_value_heads']}  head_dim {c['head_dim']}  V {c['vocab_size']}  Vd "
              f"{c['draft_vocab_size']}",
              f"aux layers {c['aux_layer_ids']}  rope {rope} theta {c['rope_theta']}  dtype "
              f"{c['torch_dtype']}", ""]
    for ch in r["checks"]:
        lines.append(f"{'PASS' if ch['ok'] else 'FAIL'}  {ch['name']:<21} {ch['detail']}")
    return "\n".join(lines)


def run(args: argparse.Namespace, ev: Emitter) -> int:
    report = collect(args.path)
    ev.answer(report, args.json, render)
    return 0 if report["ok"] else 1
