"""Waiting for a started vLLM server to answer, and what it is doing meanwhile.

A large verifier takes minutes to load, and a loaded CPU host spends minutes more in vLLM's
compile warmup; all that time the server does not answer. So each poll also reads the last line
of the run's own log (output.log: vLLM's stdout and stderr), for the caller to show.
"""

from __future__ import annotations

import asyncio
import posixpath
import time
from collections.abc import Callable

from console.checkpoints.answers import ModelEntry, model_entries
from console.errors import TransportError
from console.hosts.host import Host
from console.logs.vllm_log import strip_ansi
from console.runs.service import list_runs
from console.scheduler.registry import Run
from console.scheduler.run_status import RunStatus
from console.text import visible
from console.transport.http_client import HttpError, call

#: seconds `serve` waits for the server to answer /v1/models before it checks (a large verifier
#: takes minutes to load on 8 GPUs)
CHECK_TIMEOUT = 900.0
CHECK_POLL = 3.0
#: seconds one poll of /v1/models waits for its answer
ANSWER_TIMEOUT = 5.0
#: the log's last line is looked for in its last bytes (a progress bar's line is long)
TAIL_BYTES = 8192
LINE_WIDTH = 200

#: told each poll: the seconds waited, and the last line of the server's log ("" before any)
OnWait = Callable[[float, str], None]


async def _models(host: Host, port: int) -> list[ModelEntry]:
    """/v1/models' entries, fetched through the host's own connection (HttpError when the
    server does not answer JSON; ValueError when the JSON is not /v1/models')."""
    return model_entries(await call(host.transport, f"http://127.0.0.1:{port}/v1/models",
                                    timeout=ANSWER_TIMEOUT))


async def last_log_line(host: Host, run: Run) -> str:
    """The last non-empty line of the run's output.log, as text to show ("" when none)."""
    rec = run.records[0] if run.records else None
    if rec is None or not rec.run_dir:
        return ""
    path = posixpath.join(rec.run_dir, "output.log")
    try:
        st = await host.transport.stat(path)
        if st is None or st.is_dir:
            return ""
        start = max(0, st.size - TAIL_BYTES)
        data = await host.transport.read_range(path, start, st.size - start)
    except TransportError:
        return ""
    # a progress bar redraws with carriage returns: its latest state is the last part
    lines = [ln.rstrip("\r").rsplit("\r", 1)[-1].strip() for ln in
             data.decode("utf-8", errors="replace").split("\n")]
    last = next((ln for ln in reversed(lines) if ln), "")
    last = visible(strip_ansi(last))
    return last if len(last) <= LINE_WIDTH else last[:LINE_WIDTH - 1] + "…"


async def wait_until_served(host: Host, run: Run, port: int, timeout: float = CHECK_TIMEOUT,
                            poll: float = CHECK_POLL, on_wait: OnWait | None = None
                            ) -> tuple[list[ModelEntry] | None, str]:
    """/v1/models' entries once the server answers, or None and why it never did (the run
    ended, or `timeout` seconds went by); on_wait hears the server's last log line each poll."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    why = ""
    while True:
        try:
            return await _models(host, port), ""
        except (HttpError, ValueError) as e:
            why = e.why if isinstance(e, HttpError) else str(e)
        recs = await list_runs(host, run.id)
        if recs and all(r.status != RunStatus.RUNNING for r in recs):
            return None, f"the run {recs[0].status} before vLLM answered /v1/models " \
                         f"(`follow {run.id}` shows its log)"
        if time.monotonic() + poll > deadline:
            return None, f"vLLM did not answer /v1/models within {timeout:g} s ({why})"
        if on_wait is not None:
            on_wait(time.monotonic() - t0, await last_log_line(host, run))
        await asyncio.sleep(poll)
