"""`engine inspect`'s report as text: part of the contract the console reads (with
engine/events.py), so it is standard library only and imported by both halves. The report's
fields are built in engine/commands/inspect.py (`collect`)."""

from __future__ import annotations

from typing import Any


def render(r: dict[str, Any]) -> str:
    """The inspect report for humans: format line, tensor table, config summary, checks."""
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
