"""`python -m engine demo init DIR`: build the offline demo workspace (see
engine/demo/workspace.py); `demo update DIR`: add what a workspace built by an older engine lacks
(the recorded vLLM log, engine/demo/serve_log.py)."""

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
    update = sub.add_parser("update", help="add to the workspace in DIR what this engine puts "
                            "in one and it lacks (the recorded vLLM log)")
    update.add_argument("dir", metavar="DIR")
    update.add_argument("--json", action="store_true", help="print what was added as JSON")
    for flag, text in (("--events", "JSON-line events on stdout"),
                       ("--debug", "show tracebacks on failure")):
        update.add_argument(flag, action="store_true", default=argparse.SUPPRESS, help=text)


def run(args: argparse.Namespace, ev: Emitter) -> int:
    if args.action == "update":
        from engine.demo.serve_log import update_demo
        added = update_demo(args.dir)
        ev.answer(added, args.json, lambda a: f"demo workspace in {a['dir']}: " + (
            "added " + ", ".join(a["added"]) if a["added"] else "nothing to add"))
        return 0
    from engine.demo.workspace import init_demo
    info = init_demo(args.dir, ev, seed=args.seed, force=args.force)
    ev.answer(info, args.json, lambda i: "\n".join(
        [f"demo workspace in {i['dir']} ({i['seconds']['total']}s)"]
        + [f"  {name}: {cmd}" for name, cmd in i["commands"].items()]))
    return 0
