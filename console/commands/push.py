"""`eagle3-console push HOST [SYNC ...] [--delete] [--verify]`: send the engine and sync sets,
only what changed. Warnings (e.g. a push record entry that is ignored) go to stderr, one line
each."""

from __future__ import annotations

import argparse
import json
import sys

from console.hosts.host import HostPool
from console.hosts.push import host_trees, push
from console.settings.config import Config

HELP = ("send the engine package and sync sets to HOST (only changed files; --delete mirrors "
        "removals)")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("host", help="a configured host name")
    p.add_argument("sync", nargs="*", help="sync sets to push (default: every set for HOST)")
    p.add_argument("--delete", action="store_true",
                   help="remove remote files that an earlier push wrote and that no longer "
                        "exist locally (files push did not write are never removed)")
    p.add_argument("--verify", action="store_true",
                   help="re-read every remote file and repair what differs (files edited or "
                        "damaged on the host; also clears the pushed code's bytecode caches)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


async def run(args: argparse.Namespace, config: Config, pool: HostPool) -> int:
    host = await pool.ensure(args.host)
    trees = await host_trees(host, config, args.sync or None)

    def progress(done: int, total: int, sent: int) -> None:
        if not args.json and sys.stderr.isatty():
            print(f"\r{done}/{total} files, {_size(sent)}", end="", file=sys.stderr)

    report = await push(host, trees, delete=args.delete, verify=args.verify,
                        on_progress=progress)
    if args.json:
        for w in report.warnings:
            print(f"warning: {w}", file=sys.stderr)
        print(json.dumps({"host": report.host, "files_sent": report.files_sent,
                          "bytes_sent": report.bytes_sent, **report.record(),
                          "trees": [vars(t) for t in report.trees],
                          "warnings": report.warnings}, indent=2))
        return 0
    if sys.stderr.isatty() and report.files_sent:
        print(file=sys.stderr)
    for w in report.warnings:
        print(f"warning: {w}", file=sys.stderr)
    for t in report.trees:
        line = (f"{t.name:<12} {t.sent:>5} of {t.files} files sent, {_size(t.bytes):>9}  "
                f"-> {t.remote}")
        if t.deleted:
            line += f"  ({t.deleted} deleted)"
        if t.extra:
            line += f"  ({t.extra} remote-only kept; --delete removes them)"
        if t.foreign:
            line += f"  ({t.foreign} remote-only not pushed by us, left alone)"
        if t.cleaned:
            line += f"  ({t.cleaned} stale temp/cache files removed)"
        print(line)
    print(f"{report.files_sent} files, {report.bytes_sent} bytes sent "
          f"(manifest {report.manifest[:12]})")
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"
