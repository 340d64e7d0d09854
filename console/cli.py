"""`eagle3-console`: with no subcommand, the TUI; with one, the same action scripted.

Each subcommand lives in console/commands/<name>.py and exposes:
    HELP: str
    configure(parser: argparse.ArgumentParser) -> None
    async run(args, config: console.settings.config.Config, pool: console.hosts.host.HostPool)
        -> int   (the one pool the CLI opened: the subcommand never closes it)
A console.errors.ConsoleError prints one line `error: ...` on stderr and exits 1. What a
subcommand prints goes through console/text.py's TerminalText: a host's control characters
(escape sequences) are shown as `^X`, never sent to the terminal raw. Ctrl-C, SIGTERM
and SIGHUP cancel the subcommand (its remote commands are terminated, never orphaned); a closed
stdout (`| head`) ends it quietly.

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
import contextlib
import importlib
import os
import signal
import sys
import traceback
from collections.abc import Coroutine, Sequence
from typing import Any, cast

from console import __version__
from console.demo.config import console_config
from console.errors import ConfigError, ConsoleError
from console.hosts.host import HostPool
from console.settings.config import Config
from console.text import TerminalText

COMMANDS: dict[str, str] = {
    "doctor": "console.commands.doctor",
    "trust": "console.commands.trust",
    "push": "console.commands.push",
    "launch": "console.commands.launch",
    "runs": "console.commands.runs",
    "stop": "console.commands.stop",
    "follow": "console.commands.follow",
    "logs": "console.commands.logs",
    "inspect": "console.commands.inspect",
    "convert": "console.commands.convert",
    "serve": "console.commands.serve",
    "metrics": "console.commands.metrics",
    "compare": "console.commands.compare",
    "swap": "console.commands.swap",
    "bench": "console.commands.bench",
    "eval": "console.commands.eval",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eagle3-console", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"eagle3-console {__version__}")
    parser.add_argument("--config",
                        help="config file (default: ~/.config/eagle3-console/config.toml)")
    parser.add_argument("--theme", help="colour theme for the TUI (remembered in the config)")
    # its own dest: a subcommand's HOST positional (`inspect HOST PATH`) is `host`
    parser.add_argument("--host", dest="tui_host", metavar="HOST",
                        help="host selected when the TUI opens")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on failure")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, modname in COMMANDS.items():
        mod = importlib.import_module(modname)
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.configure(p)
        p.set_defaults(_module=mod)
    return parser


class Terminated(Exception):
    """SIGTERM or SIGHUP arrived while a subcommand ran; its work was cancelled (cleanly)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


async def with_hosts(module: Any, args: argparse.Namespace, config: Config) -> int | None:
    """A subcommand's `run`, given the one host pool it connects through: whatever the
    subcommand opened is closed when it ends, however it ends (an error, Ctrl-C, SIGTERM)."""
    async with HostPool(config) as pool:
        return cast(int | None, await module.run(args, config, pool))


async def run_subcommand(coro: Coroutine[Any, Any, int | None]) -> int | None:
    """Run a subcommand so that SIGTERM and SIGHUP end it the way Ctrl-C does: by cancelling
    it, so every remote command it started is terminated (the transports kill the remote
    process group on cancellation) instead of being left running on the host, orphaned."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(coro)
    got: list[int] = []

    def on_signal(signum: int) -> None:
        if not got:
            got.append(signum)
            task.cancel()

    handled = []
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, on_signal, sig)
            handled.append(sig)
    try:
        return await task
    except asyncio.CancelledError:
        if got:
            raise Terminated(got[0]) from None
        raise
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)


def _quiet_broken_pipe() -> int:
    """stdout's reader went away (`... | head`): exit without a traceback. Python's documented
    recipe: point stdout at /dev/null so the flush at exit cannot fail again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 128 + signal.SIGPIPE  # what the shell reports for a tool killed by SIGPIPE


def split_passthrough(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(ours, theirs): for a subcommand whose module sets PASSTHROUGH (e.g. `serve`), the words
    after its first `--` are another program's arguments, kept whole (argparse cannot hand a
    `--` tail to a subparser that has positionals). Other subcommands keep `--` as argparse
    reads it: the end of the options."""
    words = list(argv)
    i = 0
    while i < len(words):
        w = words[i]
        if w in ("--config", "--theme", "--host"):
            i += 2
            continue
        if w in COMMANDS:
            mod = importlib.import_module(COMMANDS[w])
            if getattr(mod, "PASSTHROUGH", False) and "--" in words[i + 1:]:
                j = words.index("--", i + 1)
                return words[:j], words[j + 1:]
            break
        if not w.startswith("-"):
            break
        i += 1
    return words, []


def main(argv: Sequence[str] | None = None) -> int:
    ours, theirs = split_passthrough(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(ours)
    args.passthrough = theirs
    try:
        config = console_config(args.config)
        if args.tui_host is not None and args.tui_host not in config.hosts:
            where = config.path or "the built-in config"
            raise ConfigError(f"--host {args.tui_host}: no such host in {where}; "
                              f"configured: {', '.join(config.hosts)}")
        if not args.command:
            from console.app import run_app
            return run_app(config, theme=args.theme, host=args.tui_host)
        with contextlib.redirect_stdout(TerminalText(sys.stdout)), \
                contextlib.redirect_stderr(TerminalText(sys.stderr)):
            return int(asyncio.run(run_subcommand(with_hosts(args._module, args, config))) or 0)
    except ConsoleError as e:
        if args.debug:
            traceback.print_exc()
        print(f"error: {e}", file=TerminalText(sys.stderr))
        return 1
    except KeyboardInterrupt:
        return 130
    except Terminated as e:
        return 128 + e.signum
    except BrokenPipeError:
        return _quiet_broken_pipe()


if __name__ == "__main__":
    raise SystemExit(main())
