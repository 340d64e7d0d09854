"""console/hostside/ as the host runs it: runner.py as a script from a pushed copy of the folder
(its siblings slurm_job.py and records.py loaded beside it, never from a bytecode cache),
on the oldest Python the hosts may have (3.8) when this machine has one, and the files the
console sends or fills from the folder (the checkpoint scan, the nvidia-smi fallback)."""

from __future__ import annotations

import ast
import importlib.util
import json
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import console.hostside
import console.hostside.checkpoint_scan as checkpoint_scan
from console.checkpoints import service
from console.monitor import nvidia_smi

HOSTSIDE = Path(console.hostside.__file__).resolve().parent
MODULES = sorted(p.name for p in HOSTSIDE.glob("*.py"))


def _pushed(tmp_path: Path) -> Path:
    """A copy of the folder as push leaves it on a host (no caches)."""
    pkg = tmp_path / "code" / "eagle3_hostside"
    shutil.copytree(HOSTSIDE, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return pkg


def _runner(python: str, pkg: Path, *args: str, stdin: str = "") -> tuple[int, str]:
    r = subprocess.run([python, "-B", str(pkg / "runner.py"), *args], input=stdin,
                       capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(pkg.parent)})
    return r.returncode, r.stdout + r.stderr


def _start_and_stop(python: str, pkg: Path, runs: Path) -> None:
    run_id = "p-20260101-000000-0001"
    spec = {"id": run_id, "profile": "p", "argv": ["sleep", "30"], "cwd": str(runs)}
    code, out = _runner(python, pkg, "start", str(runs / run_id), "--unless-running",
                        stdin=json.dumps(spec))
    assert code == 0 and "pid" in json.loads(out), out
    code, out = _runner(python, pkg, "list", str(runs))
    assert code == 0 and [r["status"] for r in json.loads(out)] == ["running"], out
    code, out = _runner(python, pkg, "stop", str(runs / run_id), "2")
    assert code == 0 and json.loads(out)["status"] == "stopped", out


def test_truncated_caches_of_every_module_do_not_break_the_runner(tmp_path: Path) -> None:
    pkg = _pushed(tmp_path)
    for name in MODULES:
        # a cache file Python accepts (source mtime and size match) cut short, as a full disk
        # leaves it: for runner.py's siblings too, which it loads beside it
        src = pkg / name
        pyc = Path(importlib.util.cache_from_source(str(src)))
        py_compile.compile(str(src), cfile=str(pyc), doraise=True)
        pyc.write_bytes(pyc.read_bytes()[:20])
    broken = subprocess.run([sys.executable, "-c", "import eagle3_hostside.slurm_job"],
                            env={"PYTHONPATH": str(pkg.parent)}, capture_output=True, text=True)
    assert broken.returncode != 0 and "marshal" in broken.stderr   # the caches are read
    runs = tmp_path / "root" / "runs"
    runs.mkdir(parents=True)
    code, out = _runner(sys.executable, pkg, "freeport")
    assert code == 0 and out.strip().isdigit(), out
    _start_and_stop(sys.executable, pkg, runs)
    code, out = _runner(sys.executable, pkg, "settle", str(runs / "nothing"), stdin="{}")
    assert code == 1 and "no run record" in json.loads(out)["error"], out   # slurm_job's
    code, out = _runner(sys.executable, pkg, "bogus")
    assert code == 2 and "python -B runner.py start RUN_DIR" in out, out    # the usage text


def test_runner_imported_as_a_package_module_shares_one_record_check() -> None:
    import console.hostside.records as records
    import console.hostside.runner as runner
    import console.hostside.slurm_job as slurm_job
    assert runner.record_problem is records.record_problem
    assert runner.records is records and slurm_job.records is records


def _python38() -> str | None:
    for candidate in ("python3.8", "/root/.pyenv/versions/3.8.18/bin/python3.8"):
        path = shutil.which(candidate) or (candidate if Path(candidate).is_file() else None)
        if path and subprocess.run([path, "-c", "pass"], capture_output=True).returncode == 0:
            return path
    return None


def test_the_host_helpers_run_on_python_3_8(tmp_path: Path) -> None:
    python = _python38()
    if python is None:
        pytest.skip("no working python3.8 here")
    pkg = _pushed(tmp_path)
    r = subprocess.run([python, "-c", "import ast, sys\nfor p in sys.argv[1:]:\n"
                        "    ast.parse(open(p).read(), p, feature_version=(3, 8))\n"
                        "    compile(open(p).read(), p, 'exec')",
                        *(str(pkg / n) for n in MODULES)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    runs = tmp_path / "root" / "runs"
    runs.mkdir(parents=True)
    _start_and_stop(python, pkg, runs)
    scan = subprocess.run([python, "-c", service._SCAN], capture_output=True, text=True,
                          input=json.dumps({"roots": [[str(tmp_path), "x", False],
                                                      [str(tmp_path / "gone"), "configured",
                                                       False]], "depth": 2,
                                            "max": 5}), timeout=60)
    assert scan.returncode == 0, scan.stderr
    assert json.loads(scan.stdout) == {"found": [], "missing": [[str(tmp_path / "gone"),
                                                                 "no such folder"]]}


def test_the_host_modules_stay_small() -> None:
    """The refactor's limits: no module over 600 lines, no function over 80."""
    for name in MODULES:
        text = (HOSTSIDE / name).read_text(encoding="utf-8")
        assert text.count("\n") <= 600, name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                assert node.end_lineno - node.lineno + 1 <= 80, (name, node.name)


def test_the_console_sends_the_checkpoint_scan_file(tmp_path: Path) -> None:
    assert service._SCAN == Path(checkpoint_scan.__file__).read_text(encoding="utf-8")
    ckpt = tmp_path / "runs" / "r1" / "out" / "final"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"x" * 10)
    req = {"roots": [[str(tmp_path / "runs"), "run", True]], "depth": 5, "max": 10}
    r = subprocess.run([sys.executable, "-c", service._SCAN], input=json.dumps(req),
                       capture_output=True, text=True, timeout=60, check=True)
    [found] = json.loads(r.stdout)["found"]
    assert (found["path"], found["source"], found["bytes"]) == (str(ckpt), "run r1", 12)


def test_the_fallback_script_is_the_template_filled() -> None:
    text = nvidia_smi.script("/data/it's")
    assert text.startswith("g=$(nvidia-smi --query-gpu=" + ",".join(nvidia_smi.QUERY_GPU)
                           + " --format=csv")
    assert "--query-compute-apps=" + ",".join(nvidia_smi.QUERY_APPS) + " " in text
    assert "df -Pk '/data/it'\"'\"'s' 2>/dev/null\n" in text
    assert "{printf \"%s%s\", s, $2; s=\",\"}" in text          # awk's braces, single
    assert "@QUERY" not in text and "@DISK" not in text and not text.startswith("#")
