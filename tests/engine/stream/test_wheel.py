"""`engine doctor` says whether the stream extra is usable here: which Mooncake wheel is
installed, which one this host wants (by the CUDA its torch runs) and which apt libraries are
missing. Checked on this host as it is, and in a private mount namespace where two of those
libraries are genuinely unloadable (an empty file bound over each)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.stream import wheel
from tests.paths import REPO

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


def test_the_wheel_follows_the_cuda_torch_runs_and_matches_the_pinned_extras() -> None:
    assert wheel.wheel_for(None) == "mooncake-transfer-engine-non-cuda"
    assert wheel.wheel_for("12.8") == "mooncake-transfer-engine"
    assert wheel.wheel_for("11.8") == "mooncake-transfer-engine"
    assert wheel.wheel_for("13.0") == "mooncake-transfer-engine-cuda13"
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for dist, extra in wheel.EXTRAS.items():
        assert extras[extra] == [f"{dist}=={wheel.VERSION}"], extra
    cuda_host = wheel.StreamCheck((("mooncake-transfer-engine-non-cuda", wheel.VERSION),),
                                  "12.8", ("libnuma1",), "ImportError: libnuma.so.1")
    assert not cuda_host.usable
    assert cuda_host.advice("PY") == [
        "a CUDA 12.8 host wants mooncake-transfer-engine, not mooncake-transfer-engine-non-cuda "
        "(they share the `mooncake` package): `PY -m pip uninstall -y "
        "mooncake-transfer-engine-non-cuda` then `PY -m pip install "
        f"mooncake-transfer-engine=={wheel.VERSION}`",
        "Mooncake loads these libraries even over TCP: `apt-get install libnuma1`"]


def _doctor(*prefix: str) -> tuple[dict[str, Any], str]:
    """The report's stream entry, and the human report (rendered from the same JSON report by
    the engine's own `render`)."""
    from engine.commands.doctor import render
    env = dict(os.environ, PYTHONPATH=str(REPO))
    got = subprocess.run([*prefix, sys.executable, "-m", "engine", "doctor", "--json"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    report = json.loads(got.stdout)
    return report["stream"], render(report)


def _sonames() -> dict[str, str]:
    """soname -> file, from the dynamic linker's cache (what dlopen finds by name)."""
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        if "=>" in line and "x86-64" in line or "=>" in line and "aarch64" in line:
            name, path = line.split("=>")
            found.setdefault(name.split()[0], path.strip())
    return found


def test_doctor_reports_this_hosts_wheel_and_libraries() -> None:
    s, text = _doctor()
    dists = sorted((d.metadata["Name"], d.version) for d in importlib.metadata.distributions()
                   if d.metadata["Name"].lower().startswith("mooncake-transfer-engine"))
    assert sorted((w["dist"], w["version"]) for w in s["installed"]) == dists
    have = _sonames()
    assert s["missing_apt"] == [p for p, so in wheel.APT_LIBS if so not in have]
    loads = subprocess.run([sys.executable, "-c", "import mooncake.store"],
                           capture_output=True).returncode == 0
    assert s["usable"] is loads and (s["error"] is None) is loads
    import torch
    assert s["want"] == wheel.wheel_for(torch.version.cuda if torch.cuda.is_available()
                                        else None)
    assert f"stream     {s['summary']}" in text
    assert ("(usable; " in s["summary"]) is loads


def test_doctor_names_the_apt_packages_of_libraries_that_do_not_load(tmp_path: Path) -> None:
    hidden = {"libnuma1": "libnuma.so.1", "libnl-route-3-200": "libnl-route-3.so.200"}
    have = _sonames()
    if shutil.which("unshare") is None or not all(so in have for so in hidden.values()):
        pytest.skip("needs unshare(1) and the libraries present to hide them")
    empty = tmp_path / "empty.so"
    empty.write_bytes(b"")
    binds = " && ".join(f"mount --bind {empty} {os.path.realpath(have[so])}"
                        for so in hidden.values())
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"{binds} && true"],
                           capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"no private mount namespace here ({probe.stderr.strip()[:120]})")
    wrapper = tmp_path / "hide.sh"  # runs its arguments with the libraries hidden
    wrapper.write_text(f'#!/bin/sh\n{binds} && exec "$@"\n')
    wrapper.chmod(0o755)
    s, text = _doctor("unshare", "-rm", str(wrapper))
    assert s["missing_apt"] == list(hidden)
    assert not s["usable"]
    assert ("Mooncake loads these libraries even over TCP: `apt-get install libnuma1 "
            "libnl-route-3-200`") in s["advice"]
    assert "not usable, missing libnuma1 libnl-route-3-200" in text
    if s["installed"]:  # the store really fails to load there, for that reason
        assert s["error"] and ("libnuma" in s["error"] or "libnl" in s["error"]), s["error"]
