"""`engine inspect`'s report as text, and the drafter's provenance as it is shown: part of the
contract the console reads (with engine/events.py), so it is standard library only and imported
by both halves. The report's fields are built in engine/commands/inspect.py (`collect`); its
`provenance` entry is `provenance_summary` of the drafter directory's JSON files."""

from __future__ import annotations

import json
import os
from typing import Any

# The fields of a training export's provenance.json that say where its weights came from; a
# conversion carries them over as `origin`, so a converted drafter still names its run and step.
TRAINING_KEYS = ("run", "step", "estimated_tau", "held_out_tau", "best_step", "best_tau",
                 "finetune", "data_sha256", "vocab_sha256", "draft_vocab_size")
HASH = 12   # hash prefix shown (the JSON report keeps the whole digest)


def origin_of(prov: dict[str, Any]) -> dict[str, Any] | None:
    """The training record a drafter descends from: the one a conversion carried over, else its
    own when it is a training export; None when neither says."""
    if isinstance(prov.get("origin"), dict):
        return dict(prov["origin"])
    if "run" in prov or "step" in prov:
        return {k: prov[k] for k in TRAINING_KEYS if k in prov}
    return None


def _finetune(ft: Any) -> dict[str, Any] | None:
    """The finetune source as shown: path, format and the sha256 of its (first) weight file;
    None for a drafter trained from scratch."""
    if not isinstance(ft, dict):
        return None
    shas = ft.get("sha256")
    sha = next((str(v) for v in shas.values()), None) if isinstance(shas, dict) else shas
    return {"path": ft.get("path"), "format": ft.get("format"), "sha256": sha or None}


def _from_trainer(trainer: dict[str, Any], run: dict[str, Any] | None,
                  run_dir: str | None) -> dict[str, Any]:
    """A trainer checkpoint (checkpoints/step_N): trainer.json, plus the run's run.json."""
    run = run or {}
    out: dict[str, Any] = {"written_by": "training (trainer checkpoint)", "run": run_dir,
                           "step": trainer.get("step"), "best_step": trainer.get("best_step"),
                           "best_tau": trainer.get("best_tau")}
    if "held_out_tau" in trainer:
        out["held_out_tau"] = trainer["held_out_tau"]
    for k in ("data_sha256", "vocab_sha256"):
        if k in run:
            out[k] = run[k]
    if "finetune" in run:
        out["finetune"] = _finetune(run["finetune"])
    return out


def provenance_summary(prov: dict[str, Any] | None, trainer: dict[str, Any] | None = None,
                       run: dict[str, Any] | None = None, run_dir: str | None = None
                       ) -> dict[str, Any] | None:
    """What the drafter directory says about where it came from: provenance.json (a training
    export, a conversion or a vocab remap), else a trainer checkpoint's trainer.json with its
    run's run.json. None when it records nothing (a drafter not written by this engine)."""
    if not prov:
        return _from_trainer(trainer, run, run_dir) if trainer else None
    out: dict[str, Any] = {"format": prov.get("format"), "time": prov.get("time")}
    src = prov.get("source")
    if isinstance(src, dict) and src.get("path"):
        out["written_by"] = "vocab remap" if "remap" in prov else "convert"
        out["derived_from"] = {"path": src.get("path"), "format": src.get("format")}
    else:
        out["written_by"] = "training" if "run" in prov else "engine"
    origin = origin_of(prov)
    if origin:
        out.update({k: origin[k] for k in TRAINING_KEYS if k in origin and k != "finetune"})
        out["finetune"] = _finetune(origin.get("finetune"))
    return out


def _json_or_none(path: str) -> dict[str, Any] | None:
    """A small JSON record beside the weights; None when absent or unreadable (provenance is
    information, never a reason to refuse a checkpoint)."""
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > 1 << 20:
            return None
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_provenance(d: str | os.PathLike[str]) -> dict[str, Any] | None:
    """provenance_summary of a drafter directory on this machine: its provenance.json, else a
    trainer checkpoint's trainer.json with its run's run.json (RUN/checkpoints/step_N)."""
    d = os.fspath(d)
    prov = _json_or_none(os.path.join(d, "provenance.json"))
    trainer = None if prov else _json_or_none(os.path.join(d, "trainer.json"))
    parent = os.path.dirname(os.path.abspath(d))
    run_dir = os.path.dirname(parent) if os.path.basename(parent) == "checkpoints" else None
    run = _json_or_none(os.path.join(run_dir, "run.json")) if trainer and run_dir else None
    return provenance_summary(prov, trainer, run, run_dir)


def training_origin(d: str | os.PathLike[str]) -> dict[str, Any] | None:
    """What a conversion of `d` records as `origin`: the training fields of its provenance."""
    summary = read_provenance(d) or {}
    origin = {k: summary[k] for k in TRAINING_KEYS if k in summary}
    return origin or None


def _tau_text(p: dict[str, Any]) -> str:
    if "held_out_tau" in p:
        tau = p["held_out_tau"]
        return (f"held-out tau {tau:.3f}" if isinstance(tau, (int, float))
                else "no held-out tau (the run held no samples out)")
    if isinstance(p.get("estimated_tau"), (int, float)):   # a best/ export of an older engine
        return f"estimated tau {p['estimated_tau']:.3f} (the best so far)"
    return "held-out tau not recorded"


def provenance_rows(p: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(label, value) rows for people: what wrote the drafter, the run and step with its
    held-out acceptance, the finetune source, the data and vocab hashes, the conversion."""
    if not p:
        return [("provenance", "none recorded (not written by this engine)")]
    what = str(p.get("written_by") or "engine")
    rows = [("written by", what + (f", {p['format']} style" if p.get("format") else "")
             + (f", {p['time']}" if p.get("time") else ""))]
    if p.get("run") or p.get("step") is not None:
        rows.append(("run", str(p.get("run") or "?")))
        step = f"{p.get('step')} · {_tau_text(p)}"
        if p.get("best_step") is not None and isinstance(p.get("best_tau"), (int, float)):
            step += f" · best so far: step {p['best_step']}, tau {p['best_tau']:.3f}"
        rows.append(("step", step))
        ft = p.get("finetune")
        if isinstance(ft, dict):
            sha = f", sha256 {str(ft['sha256'])[:HASH]}" if ft.get("sha256") else ""
            rows.append(("finetune", f"{ft.get('path')} ({ft.get('format') or '?'}{sha})"))
        elif "finetune" in p:
            rows.append(("finetune", "— (trained from scratch)"))
        hashes = [f"{k} sha256 {str(p[k + '_sha256'])[:HASH]}" for k in ("data", "vocab")
                  if p.get(k + "_sha256")]
        if hashes:
            rows.append(("hashes", " · ".join(hashes)))
    src = p.get("derived_from")
    if isinstance(src, dict):
        rows.append(("from", f"{src.get('path')} ({src.get('format') or '?'})"))
    return rows


def style_head(fmt: object, style: object = None) -> str:
    """`eagle format`, or for an export whose files are another style's format, `vllm export
    of eagle format` (vllm and sglang exports are eagle-format files)."""
    head = str(fmt)
    written = str(style or head)
    return f"{head} format" if written == head else f"{written} export of {head} format"


def flags_line(c: dict[str, Any]) -> str:
    """The EAGLE 3.1 flags and norm_before_residual, as JSON spells them (true/false); `?` for
    a report that does not carry one."""
    def word(v: Any) -> str:
        return "?" if v is None else json.dumps(v) if isinstance(v, bool) else str(v)
    return "  ".join(f"{k} {word(c.get(k))}" for k in (
        "norm_before_fc", "fc_norm", "norm_output", "norm_before_residual"))


def render(r: dict[str, Any]) -> str:
    """The inspect report for humans: format line, provenance, tensor table, config summary,
    checks."""
    head = style_head(r["format"], r.get("style"))
    lines = [f"{r['path']}: {head} (names {r['key_style']}, config {r['config_style']}, "
             f"{r['weights']}: {', '.join(r['files'])})", ""]
    rows = provenance_rows(r.get("provenance"))
    label = max(len(k) for k, _ in rows)
    lines += [f"{k:<{label}}  {v}" for k, v in rows] + [""]
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
              f"{c['torch_dtype']}",
              flags_line(c)]
    if c.get("kv_lora_rank") is not None:  # the MLA layer kind (engine/model/mla_layer.py)
        lines.append("layer mla  " + "  ".join(
            f"{k} {c.get(k)}" for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                        "qk_rope_head_dim", "v_head_dim")))
    lines.append("")
    for ch in r["checks"]:
        lines.append(f"{'PASS' if ch['ok'] else 'FAIL'}  {ch['name']:<21} {ch['detail']}")
    return "\n".join(lines)
