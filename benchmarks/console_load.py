"""Console load: the real app, headless, fed 8 GPUs of monitor events at 1 Hz through the local
transport and following a vLLM log that grows by 1,000 lines per second, for 60 seconds.

    .venv/bin/python benchmarks/console_load.py [--seconds 60] [--rate 1000]

Prints the console process's average CPU share of one core (target: at most 3 %) and its
resident memory after warm-up and at the end (target: flat). The agent and the log writer are
separate processes (not counted): the agent is a stand-in `python` for the host that replays
the recorded 8x H200 samples at 1 Hz (any other command it passes to the real interpreter), the
writer appends the recorded vLLM server log's lines, its stats lines every 10 s as vLLM writes
them (`--stats-every 0`: a stats-heavy log, a quarter of the lines). The visible
pane alternates between GPUs and Logs every 10 s so both redraw paths run (`--panes gpu|logs`
keeps one on screen). `--metrics` also gives the host a vLLM /metrics URL, served by a stand-in
in its own process (tests/vllm_metrics_standin.py, counters advancing each second), so the Logs
pane charts scrapes of it as well.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
FIX = REPO / "tests" / "fixtures"


def agent() -> None:
    """Stand-in for `python -m engine monitor --events`: the recording, re-timed, at 1 Hz."""
    raw = gzip.decompress((FIX / "monitor" / "gpu1_h200x8_vllm.jsonl.gz").read_bytes())
    events = [json.loads(ln) for ln in raw.decode().splitlines() if ln.strip()]
    next_t = time.monotonic()
    for i in range(10**9):
        ev = dict(events[i % len(events)])
        ev["t"], ev["interval"] = time.time(), 1.0
        sys.stdout.write(json.dumps(ev, separators=(",", ":")) + "\n")
        sys.stdout.flush()
        next_t += 1.0
        time.sleep(max(0.0, next_t - time.monotonic()))


def writer(path: str, rate: int, seconds: float, stats_every: float) -> None:
    """Append `rate` lines per second (in 20 ms slices): the recorded server log's request and
    other lines, with its stats lines (engine + spec decoding) every `stats_every` seconds as
    vLLM writes them (0: in their recorded proportion, a quarter of all lines)."""
    recorded = (FIX / "vllm" / "server.log").read_text().splitlines()
    stats = [ln for ln in recorded if "throughput:" in ln or "metrics:" in ln]
    lines = [ln for ln in recorded if ln not in stats] if stats_every else recorded
    start = time.monotonic()
    n = k = 0
    next_stats = stats_every
    with open(path, "a", encoding="utf-8") as f:
        while (now := time.monotonic()) - start < seconds:
            due = int((now - start) * rate)
            chunk = []
            while n < due and len(chunk) < rate:
                chunk.append(lines[n % len(lines)])
                n += 1
            if stats_every and now - start >= next_stats:
                chunk += stats[k % len(stats):k % len(stats) + 2]
                k, next_stats = k + 2, next_stats + stats_every
            if chunk:
                f.write("\n".join(chunk) + "\n")
                f.flush()
            time.sleep(0.02)


def metrics_server(port_file: str) -> None:
    """A /metrics stand-in whose counters advance every second, as a busy server's do."""
    from tests.vllm_metrics_standin import State, VllmMetricsStandin
    srv = VllmMetricsStandin(State())
    Path(port_file).write_text(str(srv.port))
    n = 0
    while True:
        n += 1
        srv.set(drafts=400 * n, draft_tokens=1200 * n, accepted=900 * n,
                per_position=(380 * n, 300 * n, 220 * n), generation_tokens=1300 * n,
                prompt_tokens=5000 * n, running=24, waiting=3, kv_cache_usage=0.41)
        time.sleep(1.0)


async def drive(seconds: float, rate: int, panes: str = "both",
                stats_every: float = 10.0, metrics: bool = False, profile: str = "") -> None:
    from console.app import create_app
    from console.settings.config import Config, HostConfig

    tmp = Path(tempfile.mkdtemp(prefix="console-load-"))
    log = tmp / "vllm.log"
    log.write_text("")
    python = tmp / "python"
    python.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-m" ] && [ "$2" = "engine" ] && [ "$3" = "monitor" ]; then\n'
        f'  exec {sys.executable} {Path(__file__).resolve()} --agent\nfi\n'
        f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    url = None
    if metrics:
        port_file = tmp / "metrics.port"
        server = subprocess.Popen([sys.executable, __file__, "--metrics-server", str(port_file)])
        end = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > end or server.poll() is not None:
                raise SystemExit("the /metrics stand-in did not start")
            await asyncio.sleep(0.1)
        url = f"http://127.0.0.1:{port_file.read_text()}/metrics"
    config = Config(hosts={"gpu1": HostConfig(name="gpu1", python=str(python),
                                              root=str(tmp / "root"), logs=[str(log)],
                                              metrics=url)})
    app = create_app(config, host="gpu1")
    me = psutil.Process()
    async with app.run_test(headless=True, size=(120, 40)) as pilot:
        await pilot.press("4" if panes == "logs" else "1")
        mon = app.monitors["gpu1"]
        end = time.monotonic() + 60
        while mon.sample is None:  # the engine push and the agent's start are not measured
            if time.monotonic() > end:
                raise SystemExit("the agent did not start")
            await asyncio.sleep(0.2)
        proc = subprocess.Popen([sys.executable, __file__, "--writer", str(log), str(rate),
                                 str(seconds), str(stats_every)])
        cpu0, t0 = sum(me.cpu_times()[:2]), time.monotonic()
        spy = None
        if profile:  # sampled without pausing the app, over the measured window only
            spy = subprocess.Popen(["py-spy", "record", "--nonblocking", "-r", "100", "-f", "raw",
                                    "-o", profile, "-d", str(int(seconds)), "-p", str(os.getpid())],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        warm = 10.0
        rss: list[int] = []
        rss0 = 0
        pane = 0
        while time.monotonic() - t0 < seconds:
            await asyncio.sleep(1.0)
            rss.append(me.memory_info().rss)
            if not rss0 and time.monotonic() - t0 >= warm:
                rss0 = rss[-1]
            if panes == "both" and len(rss) % 10 == 0:
                pane ^= 1
                await pilot.press("4" if pane else "1")
        cpu1, t1 = sum(me.cpu_times()[:2]), time.monotonic()
        proc.wait()
        if spy is not None:
            spy.wait()
        if metrics:
            server.kill()
        logs = app.screen.query_one("#pane-logs")
        lines = logs.model.total  # type: ignore[attr-defined]
        samples = mon.version
    share = 100 * (cpu1 - cpu0) / (t1 - t0)
    print(f"measured {t1 - t0:.0f} s; monitor samples ingested: "
          f"{samples}, log lines followed: {lines:,}")
    print(f"console CPU: {share:.1f} % of one core (target <= 3 %)"
          + (f"; /metrics scraped through the host ({url})" if metrics else ""))
    print(f"console RSS: {rss0 / 2**20:.1f} MiB after {warm:.0f} s, "
          f"{rss[-1] / 2**20:.1f} MiB at the "
          f"end, peak {max(rss) / 2**20:.1f} MiB (growth {(rss[-1] - rss0) / 2**20:+.1f} MiB; "
          "target flat)")
    print("RSS every 10 s (MiB): " + " ".join(f"{r / 2**20:.1f}" for r in rss[9::10]))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--agent":
        agent()
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--metrics-server":
        metrics_server(sys.argv[2])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--writer":
        writer(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--rate", type=int, default=1000, help="log lines per second")
    p.add_argument("--panes", choices=("both", "gpu", "logs"), default="both",
                   help="which pane is on screen (both: switch every 10 s)")
    p.add_argument("--stats-every", type=float, default=10.0,
                   help="seconds between vLLM stats lines (0: a quarter of all lines)")
    p.add_argument("--metrics", action="store_true",
                   help="the host also has a vLLM /metrics URL (a stand-in), charted from scrapes")
    p.add_argument("--profile", default="", metavar="FILE",
                   help="write a py-spy raw profile of the measured window to FILE "
                        "(py-spy on PATH)")
    args = p.parse_args()
    os.environ.setdefault("XDG_CONFIG_HOME", tempfile.mkdtemp(prefix="console-load-cfg-"))
    asyncio.run(drive(args.seconds, args.rate, args.panes, args.stats_every, args.metrics,
                      args.profile))


if __name__ == "__main__":
    main()
