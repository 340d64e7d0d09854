"""Processes of Mooncake's that we start and own: where its programs are, free ports, and a stop
that signals only the process we started (its PID and its start time, `BOOT_ID:TICKS`, as
engine/ckpt/output_dir.py records owners): a PID reused by another program is left alone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from engine.ckpt.output_dir import process_start
from engine.errors import EngineError


def mooncake_binary(name: str) -> str:
    """A Mooncake program beside this Python (a venv's bin), else on PATH, else in the wheel."""
    here = Path(sys.executable).parent / name
    if here.is_file():
        return str(here)
    found = shutil.which(name)
    if found:
        return found
    with contextlib.suppress(ImportError):
        import mooncake
        inside = Path(mooncake.__file__).parent / name
        if inside.is_file():
            return str(inside)
    raise EngineError(f"{name}: not found (install the stream extra: "
                      "pip install 'eagle3-console[stream]')")


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def accepts(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.2).close()
    except OSError:
        return False
    return True


def stop_owned(pid: int, start: str | None, proc: subprocess.Popen[bytes] | None,
               grace_s: float) -> bool:
    """TERM, then KILL after `grace_s`, only while `pid` still has start time `start` (a PID
    reused by another program is left alone). True when we signalled it and it is gone."""
    def ours() -> bool:
        return start is not None and process_start(pid) == start

    def alive() -> bool:
        return proc.poll() is None if proc is not None else ours()

    stopped = False
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if not ours() or not alive():
            break
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
            stopped = True
        end = time.monotonic() + wait
        while time.monotonic() < end and alive():
            time.sleep(0.02)
        if not alive():
            break
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1)
    return stopped and not alive()
