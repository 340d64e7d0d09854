"""The engine's command line: `python -m engine COMMAND [options]` (also installed as `eagle3`).

Each command lives in its own module under engine/commands/ and exposes:
    HELP: str                                   one line for `--help`
    configure(parser: argparse.ArgumentParser)  adds its options (no heavy imports here)
    run(args, ev: engine.events.Emitter) -> int  does the work; heavy imports go inside

Every command takes `--events` (JSON lines on stdout, see engine/events.py) and `--debug`
(show tracebacks). A failure prints one line `error: ...` on stderr and exits non-zero.

Examples:
    python -m engine doctor --path /data
    python -m engine inspect /ckpt/aq-medai-kimi-k2-eagle3 --json
    python -m engine convert SRC DST --to vllm
    torchrun --nproc-per-node 8 -m engine train --target T --data D --out RUN
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from engine import __version__
from engine.errors import EngineError, UsageError
from engine.events import Emitter

# Command name -> module. Order is the order of `--help`.
COMMANDS: dict[str, str] = {
    "doctor": "engine.commands.doctor",
    "inspect": "engine.commands.inspect",
    "convert": "engine.commands.convert",
    "vocab": "engine.commands.vocab",
    "regen": "engine.commands.regen",
    "prepare": "engine.commands.prepare",
    "capture-server": "engine.commands.capture_server",
    "train": "engine.commands.train",
    "stream-master": "engine.commands.stream_master",
    "stream-put": "engine.commands.stream_put",
    "stream-capture": "engine.commands.stream_capture",
    "eval": "engine.commands.eval",
    "demo": "engine.commands.demo",
    "monitor": "engine.commands.monitor",
}


def _common() -> _Parser:
    p = _Parser(add_help=False)
    p.add_argument("--events", action="store_true",
                   help="write JSON-line events on stdout (for the console) instead of human "
                        "output")
    p.add_argument("--debug", action="store_true", help="show tracebacks on failure")
    return p


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m engine", description=__doc__.split("\n")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"eagle3 engine {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    common = _common()
    for name, modname in COMMANDS.items():
        if importlib.util.find_spec(modname) is None:
            continue
        mod = importlib.import_module(modname)
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP, parents=[common])
        mod.configure(p)
        p.set_defaults(_module=mod)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    json_mode = "--events" in argv
    cmd = next((a for a in argv if not a.startswith("-")), "engine")
    ev = Emitter(cmd, json_mode=json_mode)
    try:
        args = build_parser().parse_args(argv)
        if not getattr(args, "command", None):
            build_parser().print_help()
            return 2
        return int(args._module.run(args, ev) or 0)
    except UsageError as e:
        ev.error(str(e), "UsageError")
        print(f"error: {e}", file=sys.stderr)
        return 2
    except EngineError as e:
        ev.error(str(e), type(e).__name__)
        if debug:
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        ev.error("interrupted", "KeyboardInterrupt")
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # an engine bug: still one line unless --debug
        msg = f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else type(e).__name__
        ev.error(msg, type(e).__name__)
        if debug:
            traceback.print_exc()
        print(f"error: {msg} (run with --debug for the traceback)", file=sys.stderr)
        return 1
    finally:
        ev.close()
