"""`eagle3-console swap HOST CKPT [--url URL] [--json]`: put the drafter CKPT (a folder on HOST)
into a running vLLM server on HOST (--url, else the newest `serve` there that still runs), without
restarting it. The server is asked what it serves and started with; the drafter is checked
against that (layer kind, hidden and head sizes, vocab sizes, aux layer ids, EAGLE 3.1 flags, k,
tensor shapes) and refused by name when the server cannot take it; the swap's weight version
(NAME@SHA256) is read back from the server's /weight_info."""

from __future__ import annotations

import argparse
import json
import sys

from console.checkpoints.swap import swap
from console.hosts.host import HostPool
from console.settings.config import Config

HELP = "swap a drafter into a running vLLM server on HOST (no restart)"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("host", help="a configured host name (the server runs there)")
    p.add_argument("ckpt", help="drafter checkpoint folder on that host (a vLLM-loadable export)")
    p.add_argument("--url", help="the server's base URL as seen from the host, e.g. "
                                 "http://127.0.0.1:8000 (default: the newest `serve` on HOST that "
                                 "still runs)")
    p.add_argument("--json", action="store_true", help="print the swap as JSON")


async def run(args: argparse.Namespace, config: Config, pool: HostPool) -> int:
    done = await swap(await pool.ensure(args.host), args.ckpt, args.url)
    if args.json:
        print(json.dumps(done, indent=2))
        return 0
    print(f"{args.host}: {done['url']} now serves {done['drafter']}")
    print(f"  weight version {done['weight_version']} (was {done['previous_version']}), "
          f"swapped in {done['seconds']:.3f} s")
    said = "as the server says" if done["server"]["from"] == "server" else \
        f"as recorded here: the server does not say ({done['server']['why']})"
    print(f"  checked against {done['checked_against']}, the drafter it started with ({said})")
    for line in (done["note"], done["server"]["records_disagree"]):
        if line:
            print(f"note: {line}", file=sys.stderr)
    return 0
