"""`eagle3-console`: with no subcommand, the TUI; with one, the same action scripted.

Each subcommand lives in console/commands/<name>.py and exposes:
    HELP: str
    configure(parser: argparse.ArgumentParser) -> None
    async run(args, config: console.config.Config) -> int
A console.errors.ConsoleError prints one line `error: ...` on stderr and exits 1.

    eagle3-console                       open the console (config from --config or the XDG path)
    eagle3-console doctor HOST           what HOST can run (Python, torch, GPUs, disk)
    eagle3-console push HOST [SYNC ...]  send the engine and sync sets; only what changed
    eagle3-console launch PROFILE        start a detached run (survives disconnects)
    eagle3-console runs HOST             the run registry on HOST
    eagle3-console follow RUN | stop RUN | logs HOST PATH
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import sys
import traceback
from collections.abc import Sequence

from console import __version__
from console.config import load_config
from console.errors import ConsoleError

COMMANDS: dict[str, str] = {
    "doctor": "console.commands.doctor",
    "trust": "console.commands.trust",
    "push": "console.commands.push",
    "launch": "console.commands.launch",
    "runs": "console.commands.runs",
    "stop": "console.commands.stop",
    "follow": "console.commands.follow",
    "logs": "console.commands.logs",
    "monitor": "console.commands.monitor",
    "inspect": "console.commands.inspect",
    "convert": "console.commands.convert",
    "serve": "console.commands.serve",
    "metrics": "console.commands.metrics",
    "compare": "console.commands.compare",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle3-console", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"eagle3-console {__version__}")
    parser.add_argument("--config", help="config file (default: ~/.config/eagle3-console/config.toml)")
    parser.add_argument("--theme", help="colour theme for the TUI (remembered in the config)")
    parser.add_argument("--host", help="host selected when the TUI opens")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on failure")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, modname in COMMANDS.items():
        if importlib.util.find_spec(modname) is None:
            continue
        mod = importlib.import_module(modname)
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.configure(p)
        p.set_defaults(_module=mod)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config)
        if not args.command:
            from console.app import run_app
            return run_app(config, theme=args.theme, host=args.host)
        return int(asyncio.run(args._module.run(args, config)) or 0)
    except ConsoleError as e:
        if args.debug:
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
