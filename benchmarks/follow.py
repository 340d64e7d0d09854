"""Follow benchmark: our LogFollower + vLLM parser vs `ssh host tail -f | wc -l`, side by side.

    .venv/bin/python benchmarks/follow.py [--lines 1000000]

A writer appends a vLLM-like server log (request lines, with an engine-stats and a SpecDecoding
line every 500: far denser than vLLM's one pair per 10 s) as fast as it can. Each consumer is
connected and waiting before the writer is released; the time is from release to the consumer
holding every line. Ours parses the lines `LineBatch.containing(MARKERS)` picks (through
`parse_line`) and checks the count of metrics records; the baseline only counts newlines.
Target: at least 0.8x the baseline's lines/s, with our memory bounded (RSS growth reported
beside the log's size).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from console.logs.follow import CHUNK, LogFollower
from console.logs.vllm_log import MARKERS, parse_line
from console.transport.ssh import SSHTransport  # noqa: E402
from tests.sshd import SSHD, start_sshd  # noqa: E402

# waits for a line on stdin, then writes N lines as fast as it can
WRITER = r"""
import sys
path, n = sys.argv[1], int(sys.argv[2])
req = ("INFO 11-30 12:01:02 [logger.py:39] Received request chatcmpl-%08d: params: "
       "SamplingParams(n=1, temperature=0.7, top_p=0.95, max_tokens=512), lora_request: None.\n")
eng = ("INFO 11-30 12:01:02 [loggers.py:123] Engine 000: Avg prompt throughput: 12.3 tokens/s, "
       "Avg generation throughput: 456.7 tokens/s, Running: 4 reqs, Waiting: 0 reqs, "
       "GPU KV cache usage: 12.5%, Prefix cache hit rate: 40.0%\n")
spec = ("INFO 11-30 12:01:02 [loggers.py:140] SpecDecoding metrics: Mean acceptance length: 2.84, "
        "Accepted throughput: 120.50 tokens/s, Drafted throughput: 210.00 tokens/s, Accepted: "
        "1205 tokens, Drafted: 2100 tokens, Per-position acceptance rate: 0.812, 0.601, 0.427, "
        "Avg Draft acceptance rate: 57.4%\n")
sys.stdin.readline()
with open(path, "a", buffering=1 << 20) as f:
    for i in range(n):
        f.write(eng if i % 500 == 498 else spec if i % 500 == 499 else req % i)
"""


def start_writer(path: Path, n: int) -> subprocess.Popen[str]:
    path.write_text("")
    return subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(n)],
                            stdin=subprocess.PIPE, text=True)


def release(writer: subprocess.Popen[str]) -> float:
    assert writer.stdin is not None
    t0 = time.perf_counter()
    writer.stdin.write("go\n")
    writer.stdin.flush()
    return t0


def cpu_of(procs: list[psutil.Process]) -> float:
    """user + system seconds of procs (those gone count 0)."""
    total = 0.0
    for p in procs:
        try:
            total += sum(p.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def baseline(sshd: SSHD, path: Path, n: int, settle: float) -> tuple[float, float]:
    """(seconds, client CPU seconds: ssh + wc, from release to the count)."""
    writer = start_writer(path, n)
    cmd = (f"{' '.join(sshd.ssh_argv())} 'tail -n +1 -s 0.05 -F --pid={writer.pid} {path}' "
           f"| wc -l")
    counter = subprocess.Popen(["sh", "-c", cmd], stdout=subprocess.PIPE, text=True)
    time.sleep(settle)                       # connected and tailing before the writer starts
    client = psutil.Process(counter.pid).children()
    cpu0 = cpu_of(client)
    t0 = release(writer)
    writer.wait()  # reap it now: `tail --pid` takes a zombie for a live process
    assert counter.stdout is not None
    out = counter.stdout.read()
    _, status, usage = os.wait4(counter.pid, 0)   # sh waited for ssh and wc: their CPU is here
    counter.returncode = os.waitstatus_to_exitcode(status)
    elapsed = time.perf_counter() - t0
    got = int(out.strip())
    assert got == n, f"tail counted {got} of {n}"
    return elapsed, usage.ru_utime + usage.ru_stime - cpu0


async def ours(sshd: SSHD, path: Path, n: int, settle: float, chunk: int
               ) -> tuple[float, float, int, int]:
    """(seconds, CPU seconds of this process from release to the last line, RSS growth,
    log size)."""
    writer = start_writer(path, n)
    transport = SSHTransport("bench", sshd.target, known_hosts=str(sshd.known_hosts),
                             identity=str(sshd.user_key))
    await transport.connect()
    follower = LogFollower(transport, str(path), start="begin", poll=0.05, chunk=chunk)
    me = psutil.Process()
    rss0 = peak = me.memory_info().rss
    count = metrics = 0
    go = asyncio.Event()

    async def consume() -> None:
        nonlocal count, metrics, peak
        async for batch in follower.batches():
            for line in batch.containing(MARKERS):   # the candidates; the rest stay bytes
                if parse_line(line.text) is not None:
                    metrics += 1
            count += len(batch)
            peak = max(peak, me.memory_info().rss)
            if count >= n:
                follower.stop()
            go.set()

    task = asyncio.ensure_future(consume())
    await asyncio.sleep(settle)
    cpu0 = sum(me.cpu_times()[:2])
    t0 = release(writer)
    try:
        await asyncio.wait_for(task, 120)
    except asyncio.TimeoutError:
        raise RuntimeError(f"the follower had {count} of {n} lines after 120 s "
                           f"(offset {follower.offset}, file {path.stat().st_size})") from None
    elapsed = time.perf_counter() - t0
    cpu = sum(me.cpu_times()[:2]) - cpu0
    writer.wait()
    await transport.close()
    assert count == n and metrics == 2 * (n // 500), (count, metrics)
    return elapsed, cpu, peak - rss0, path.stat().st_size


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chunk-mb", type=float, default=CHUNK / 2**20, help="LogFollower read size")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds to connect before writing")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="eagle3-bench-follow-"))
    sshd = start_sshd(work / "sshd")
    t_base, t_ours, c_base, c_ours, rss, size = [], [], [], [], 0, 0
    try:
        for r in range(args.rounds):
            log = work / f"vllm-{r}.log"
            for side in ("tail", "ours") if r % 2 else ("ours", "tail"):   # interleaved
                if side == "tail":
                    elapsed, cpu = baseline(sshd, log, args.lines, args.settle)
                    t_base.append(elapsed)
                    c_base.append(cpu)
                else:
                    elapsed, cpu, grew, size = await ours(sshd, log, args.lines, args.settle,
                                                          int(args.chunk_mb * 2**20))
                    t_ours.append(elapsed)
                    c_ours.append(cpu)
                    rss = max(rss, grew)
                log.unlink()
            print(f"round {r + 1}: tail {t_base[-1]:.3f} s, ours {t_ours[-1]:.3f} s, "
                  f"ratio {t_base[-1] / t_ours[-1]:.2f}x; client CPU tail {c_base[-1]:.2f} s, "
                  f"ours {c_ours[-1]:.2f} s", flush=True)
    finally:
        sshd.stop()
        shutil.rmtree(work, ignore_errors=True)
    b, o = min(t_base), min(t_ours)
    ratios = sorted(tb / to for tb, to in zip(t_base, t_ours, strict=True))
    print(f"{'consumer':<44} {'seconds':>8} {'lines/s':>12} {'client CPU s':>13}")
    print(f"{'ssh host tail -f | wc -l':<44} {b:8.3f} {args.lines / b:12,.0f} "
          f"{statistics.median(c_base):13.2f}")
    print(f"{'LogFollower + parse_line (ours)':<44} {o:8.3f} {args.lines / o:12,.0f} "
          f"{statistics.median(c_ours):13.2f}")
    print(f"ratio (ours / tail, lines/s, best of {args.rounds}): {b / o:.2f}x   target >= 0.8x; "
          f"per round: median {statistics.median(ratios):.2f}x, "
          f"range {ratios[0]:.2f}-{ratios[-1]:.2f}x")
    print("client CPU is the consumer's own (ours: this process; tail: ssh + wc), median; "
          f"load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"memory: RSS grew {rss / 2**20:.1f} MiB while following a {size / 2**20:.0f} MiB log")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
