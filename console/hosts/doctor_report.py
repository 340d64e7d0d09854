"""The engine's doctor report (`python -m engine doctor --events`) drawn as text: the same for
`eagle3-console doctor` and the Host pane."""

from __future__ import annotations

from typing import Any


def render(r: dict[str, Any]) -> str:
    """The engine's doctor report for humans (the CLI and the Host pane): one label column,
    torch once (on its own line, with its build), whatever engine version wrote the report."""
    head, rows = report_rows(r)
    width = max(len(k) for k, _v in rows)
    return "\n".join([head, *(f"{k:<{width}}  {v}" for k, v in rows)])


def report_rows(r: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    """The report's first line and its (label, value) rows (a GPU's row has no label)."""
    rows: list[tuple[str, str]] = [("python", f"{r.get('python')}  ({r.get('executable')})"),
                                   ("cpus", str(r.get("cpus")))]
    rows += [(name, ver or "MISSING") for name, ver in (r.get("packages") or {}).items()
             if name != "torch"]
    t = r.get("torch") or {}
    if t.get("available"):
        build = f"CUDA {t['cuda']}, available: {t['cuda_available']}" if t.get("cuda") \
            else "CPU build"
        rows.append(("torch", f"{t.get('version')} ({build})"))
    else:
        rows.append(("torch", f"not importable: {t.get('error')}"))
    gpus = r.get("gpus") or []
    rows.append(("gpus", f"{len(gpus)} ({r.get('nvml')})" if gpus else f"none ({r.get('nvml')})"))
    rows += [("", f"[{g['index']}] {g['name']}  {g['memory_total'] / 2**30:.0f} GiB")
             for g in gpus]
    v = r.get("vllm")
    if isinstance(v, dict):  # engines before it did not report vLLM
        rows.append(("vllm", f"{v.get('version') or 'not installed'}"
                             + (f" ({v['command']})" if v.get("command")
                                else " (no vllm command found)")))
    s = r.get("stream")
    if isinstance(s, dict):  # engines before it did not report the stream extra
        rows.append(("stream", str(s.get("summary"))))
        rows += [("", str(a)) for a in s.get("advice") or []]
    d = r.get("disk") or {}
    rows.append(("disk", f"{d['free'] / 2**30:.1f} GiB free of {d['total'] / 2**30:.1f} GiB at "
                         f"{d['path']}" if "free" in d else f"{d.get('path')}: {d.get('error')}"))
    pushed = r.get("pushed")
    if isinstance(pushed, dict):
        sent = pushed.get("files_sent", 0)
        rows.append(("engine", f"pushed to {pushed.get('dir')} ("
                               + (f"{sent} file{'s' * (sent != 1)} sent" if sent else "up to date")
                               + f", manifest {str(pushed.get('manifest', ''))[:12]})"))
    rows += [("PROBLEM", p) for p in r.get("problems") or []]
    head = f"eagle3 engine {r.get('engine')} on {r.get('hostname')} ({r.get('platform')})"
    return head, rows
