"""`eagle3-console serve HOST CKPT --verifier V [--tp N] [--k K] [--port P] [-- EXTRA...]`:
inspect the drafter on HOST, refuse what vLLM would not load, then start `vllm serve` with it as
a detached run (stop it with `stop RUN`, watch its log with `follow RUN`). Then, until the
server answers (at most --check-timeout seconds), wait, showing the last line of its log as it
changes (on stderr), and read back what vLLM loaded (its startup log and /v1/models): a field
that did not reach it is a warning (`warnings` in --json)."""

from __future__ import annotations

import argparse
import json
import sys

from console.checkpoints.serve import (
    CHECK_TIMEOUT,
    ServedCheck,
    ServeRequest,
    check_served,
    serve,
    vllm_argv,
)
from console.hosts.host import HostPool
from console.settings.config import Config

PASSTHROUGH = True  # the words after `--` are `vllm serve`'s (console/cli.py)
HELP = "serve a drafter checkpoint in vLLM on HOST (speculative decoding), as a detached run"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("host", help="a configured host name (`local` is built in)")
    p.add_argument("ckpt", help="drafter checkpoint folder on that host")
    p.add_argument("--verifier", required=True, metavar="NAME_OR_PATH",
                   help="the target model vLLM serves (a hub name or a folder on the host)")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel size (default 1)")
    p.add_argument("--k", type=int, default=3, help="speculative tokens per step (default 3)")
    p.add_argument("--port", type=int, default=8000, help="server port on the host (default 8000)")
    p.add_argument("--force", action="store_true", help="start even if it is already served")
    p.add_argument("--no-swap", action="store_true",
                   help="without vLLM's weight-update routes (dev mode) and our drafter backend: "
                        "`swap` cannot replace its drafter")
    p.add_argument("--json", action="store_true", help="print the run and the command as JSON")
    p.add_argument("--check-timeout", type=float, default=CHECK_TIMEOUT, metavar="SECONDS",
                   help="how long to wait for the server before checking what it loaded "
                        f"(default {CHECK_TIMEOUT:g})")
    p.add_argument("--no-check", action="store_true",
                   help="return once started, without reading back what vLLM loaded")
    p.epilog = "Words after `--` go to `vllm serve` as they are."


async def run(args: argparse.Namespace, config: Config, pool: HostPool) -> int:
    req = ServeRequest(ckpt=args.ckpt, verifier=args.verifier, tp=args.tp, k=args.k,
                       port=args.port, extra=list(args.passthrough), swappable=not args.no_swap)
    checked: ServedCheck | None = None
    shown = [""]

    def waiting(seconds: float, line: str) -> None:
        """What vLLM is doing while it does not answer yet (its log's last line, when new)."""
        if line and line != shown[0]:
            shown[0] = line
            print(f"  waiting for vLLM ({seconds:.0f} s): {line}", file=sys.stderr, flush=True)

    started = await serve(config, args.host, req, pool, force=args.force)
    if not args.no_check:
        checked = await check_served(pool[args.host], req, started,
                                     timeout=args.check_timeout, on_wait=waiting)
    warnings = checked.warnings if checked else []
    if args.json:
        print(json.dumps({"id": started.id, "status": started.status,
                          "argv": vllm_argv(req), "records": [r.to_json() for r in started.records],
                          "served": checked.to_dict() if checked else None,
                          "warnings": warnings}, indent=2))
        return 0
    print(started.id)
    for r in started.records:
        print(f"  {r.host}: pid {r.pid} {r.status}  {r.run_dir}")
    print(f"  metrics: http://127.0.0.1:{args.port}/metrics on {args.host}")
    if checked:
        print(f"  served: {checked.summary()}")
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    return 0
