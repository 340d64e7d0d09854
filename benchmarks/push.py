"""Push benchmark: our incremental push vs rsync over ssh, side by side, against a test sshd.

    .venv/bin/python benchmarks/push.py [--files 2000] [--mb 200] [--rounds 5]

(a) a 2,000-file tree with one changed file: our push on its already-open connection vs
    `rsync -a -e "ssh -F CFG"` of the same tree (target: at most 0.5x rsync's time);
(b) a first push of 200 MB (incompressible) to an empty folder (target: at most 1.2x).
Both tools keep their own destination; each round changes one file in the source first.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from console.hosts.host import Host
from console.hosts.push import Tree, push
from console.settings.config import HostConfig
from tests.sshd import SSHD, start_sshd  # noqa: E402


def make_tree(root: Path, files: int) -> None:
    for i in range(files):
        p = root / f"pkg{i % 40:02d}" / f"module_{i:05d}.py"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"# file {i}\n" + "x = 1\n" * (100 + i % 400))


def make_big(root: Path, mb: int, per_file_mb: int = 4) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(max(1, mb // per_file_mb)):
        (root / f"shard_{i:03d}.bin").write_bytes(os.urandom(per_file_mb * 1024 * 1024))


def rsync(sshd: SSHD, src: Path, dst: Path) -> float:
    t = time.perf_counter()
    subprocess.run(["rsync", "-a", "-e", f"ssh -F {sshd.ssh_config}", f"{src}/",
                    f"{sshd.alias}:{dst}/"], check=True)
    return time.perf_counter() - t


async def ours(host: Host, src: Path, dst: Path) -> tuple[float, int]:
    t = time.perf_counter()
    report = await push(host, [Tree("bench", src, str(dst))])
    return time.perf_counter() - t, report.files_sent


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--big-rounds", type=int, default=3)
    args = ap.parse_args()
    if shutil.which("rsync") is None:
        print("rsync is not installed", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="eagle3-bench-push-"))
    sshd = start_sshd(work / "sshd")
    host = Host(HostConfig(name="bench", ssh=sshd.target, known_hosts=str(sshd.known_hosts),
                           identity=str(sshd.user_key), python=sys.executable,
                           root=str(work / "root")))
    try:
        await host.connect()
        # (a) many files, one changed
        src = work / "tree"
        make_tree(src, args.files)
        ours_dst, rsync_dst = work / "dst-ours", work / "dst-rsync"
        await ours(host, src, ours_dst)
        rsync(sshd, src, rsync_dst)
        t_ours, t_rsync = [], []
        for r in range(args.rounds):
            victim = src / "pkg07" / f"module_{7 + 40 * r:05d}.py"
            victim.write_text(victim.read_text() + f"y = {r}\n")
            elapsed, sent = await ours(host, src, ours_dst)
            assert sent == 1, sent
            t_ours.append(elapsed)
            t_rsync.append(rsync(sshd, src, rsync_dst))
        a_ours, a_rsync = statistics.median(t_ours), statistics.median(t_rsync)
        # (b) a first push of big files
        big = work / "big"
        make_big(big, args.mb)
        t_ours, t_rsync = [], []
        for r in range(args.big_rounds):  # alternate who goes first: the box may be busy
            first_ours = r % 2 == 0
            if not first_ours:
                t_rsync.append(rsync(sshd, big, work / f"big-rsync-{r}"))
            elapsed, sent = await ours(host, big, work / f"big-ours-{r}")
            t_ours.append(elapsed)
            if first_ours:
                t_rsync.append(rsync(sshd, big, work / f"big-rsync-{r}"))
            shutil.rmtree(work / f"big-ours-{r}")
            shutil.rmtree(work / f"big-rsync-{r}")
        b_ours, b_rsync = statistics.median(t_ours), statistics.median(t_rsync)
    finally:
        await host.close()
        sshd.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'case':<50} {'ours':>9} {'rsync':>9} {'ratio':>7}  target")
    print(f"{f'(a) {args.files} files, 1 changed (median of {args.rounds})':<50} "
          f"{a_ours:8.3f}s {a_rsync:8.3f}s {a_ours / a_rsync:6.2f}x  <= 0.5x")
    print(f"{f'(b) first push, {args.mb} MB, {sent} files (median of {args.big_rounds})':<50} "
          f"{b_ours:8.3f}s {b_rsync:8.3f}s {b_ours / b_rsync:6.2f}x  <= 1.2x")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
