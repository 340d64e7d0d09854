"""`python -m engine demo init DIR`: build the offline demo workspace (see
engine/demo/workspace.py)."""

from __future__ import annotations

import argparse

from engine.events import Emitter

HELP = "build a small offline demo workspace: tiny target, conversations, data, public drafter"


def configure(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    init = sub.add_parser("init", help="create the workspace in DIR")
    init.add_argument("dir", metavar="DIR")
    init.add_argument("--force", action="store_true", help="replace DIR if it exists")
    init.add_argument("--seed", type=int, default=0)
    init.add_argument("--json", action="store_true", help="print what was built as JSON")
    # `demo init DIR --events` as well as `demo --events init DIR` (SUPPRESS: never resets them)
    init.add_argument("--events", action="store_true", default=argparse.SUPPRESS,
                      help="JSON-line events on stdout")
    init.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                      help="show tracebacks on failure")


def run(args: argparse.Namespace, ev: Emitter) -> int:
    from engine.demo.workspace import init_demo
    info = init_demo(args.dir, ev, seed=args.seed, force=args.force)
    ev.answer(info, args.json, lambda i: "\n".join(
        [f"demo workspace in {i['dir']} ({i['seconds']['total']}s)"]
        + [f"  {name}: {cmd}" for name, cmd in i["commands"].items()]))
    return 0
