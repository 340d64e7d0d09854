"""`python -m engine train`: train or finetune an EAGLE-3 drafter (see engine/training/train.py).

The options are generated from `TrainConfig` (engine/training/config.py): one per field, named
`--field-name`, with the field's type, default and docstring (as help); `--json` is this
command's own.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any

from engine.events import Emitter
from engine.training.config import TrainConfig, field_docs

HELP = "train or finetune an EAGLE-3 drafter on prepared target features (torchrun for many GPUs)"


def configure(p: argparse.ArgumentParser) -> None:
    p.formatter_class = _ShowDefaults
    add_config_options(p)
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


class _ShowDefaults(argparse.HelpFormatter):
    """Help that ends with the default when there is one to show (not None, not False)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        shown = action.default is not None and action.default is not False \
            and action.default is not argparse.SUPPRESS
        if text and action.option_strings and shown and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


def add_config_options(p: argparse.ArgumentParser) -> None:
    """One option per TrainConfig field, in field order (module docstring): required when the
    field has no default; booleans are flags (store_true, or --no-X when the default is True);
    `metadata["cli"]` adds flags, metavar, choices or a mutually exclusive group."""
    hints = typing.get_type_hints(TrainConfig)
    docs = field_docs(TrainConfig)
    groups: dict[str, Any] = {}
    for f in dataclasses.fields(TrainConfig):
        cli = dict(f.metadata.get("cli", {}))
        flags = cli.pop("flags", None) or (option_name(f.name),)
        kw: dict[str, Any] = {"dest": f.name, "help": docs[f.name].replace("%", "%%")}
        kind = _value_type(hints[f.name])
        if kind is bool:
            kw["action"] = argparse.BooleanOptionalAction if f.default is True else "store_true"
        elif kind is not str:
            kw["type"] = kind
        if f.default is dataclasses.MISSING:
            kw["required"] = True
        elif kind is not bool:
            kw["default"] = f.default
        group = cli.pop("exclusive", None)
        kw.update(cli)  # metavar, choices
        if group is not None and group not in groups:
            groups[group] = p.add_mutually_exclusive_group()
        (p if group is None else groups[group]).add_argument(*flags, **kw)


def option_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _value_type(hint: Any) -> type:
    """int for `int | None`, and so on: the type an option's value is parsed to."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    kind = args[0] if args else hint
    if not isinstance(kind, type) or kind not in (bool, int, float, str):
        raise TypeError(f"TrainConfig field of type {hint!r}: no option type for it")
    return kind


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})


def run(args: argparse.Namespace, ev: Emitter) -> int:
    import os
    import sys

    from engine.training.train import train
    cfg = config_from_args(args)
    result = train(cfg, ev, argv=sys.argv)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0  # under torchrun, rank 0 alone reports
    def text(r: dict[str, Any]) -> str:
        m = r["metrics"]
        return (f"trained {r['steps']} steps: loss {m.get('loss', float('nan')):.4f}, "
                f"acc_0 {m.get('acc_0', 0):.3f}, estimated tau {m.get('tau', 0):.3f}; "
                f"drafter in {r['final']} (best: {r['best']})")

    ev.answer(result, args.json, text)
    return 0
