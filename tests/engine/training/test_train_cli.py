"""`engine train`'s options come from TrainConfig (engine/commands/train.py): one option per field,
with the field's type, default and docstring, so the two cannot drift apart."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from pathlib import Path

import pytest

from engine.cli import build_parser
from engine.commands import train as train_cmd
from engine.errors import UsageError
from engine.training.config import TrainConfig, field_docs

FIELDS = dataclasses.fields(TrainConfig)

# The options (and metavars) the hand-written parser had before it was generated: none may go.
BEFORE = {
    "--target": "TARGET", "--data": "DATA", "--out": "OUT", "--finetune-from": "CKPT",
    "--vocab": "FILE", "--rebuild-vocab": None, "--draft-vocab-size": "DRAFT_VOCAB_SIZE",
    "--resume": None, "--ttt-steps": "TTT_STEPS", "--lr": "LR", "--epochs": "EPOCHS",
    "--max-steps": "MAX_STEPS", "--batch-tokens": "BATCH_TOKENS", "--grad-accum": "GRAD_ACCUM",
    "--warmup-ratio": "WARMUP_RATIO", "--save-every": "SAVE_EVERY", "--keep": "KEEP",
    "--seed": "SEED", "--holdout": "HOLDOUT", "--online": None, "--max-len": "MAX_LEN",
    "--from-vllm": "URL", "--model": "VLLM_MODEL", "--concurrency": "CONCURRENCY",
    "--prefetch": "PREFETCH", "--fsdp": None, "--freeze-lm-head": None, "--compile": None,
    "--checkpoint-activations": None, "--precision": "{bf16,fp32}", "--device": "DEVICE",
    "--json": None,
}


def train_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="train")
    train_cmd.configure(p)
    return p


def actions() -> dict[str, argparse.Action]:
    return {a.dest: a for a in train_parser()._actions}


def test_every_field_has_a_docstring() -> None:
    docs = field_docs(TrainConfig)
    assert [f.name for f in FIELDS] == list(docs)
    assert all(docs.values())


def test_every_field_is_one_option_with_its_default_type_and_docstring() -> None:
    acts, docs = actions(), field_docs(TrainConfig)
    hints = typing.get_type_hints(TrainConfig)
    for f in FIELDS:
        assert f.name in acts, f"TrainConfig.{f.name} has no `engine train` option"
        a = acts[f.name]
        assert a.help is not None and a.help.replace("%%", "%") == docs[f.name], f.name
        if f.default is dataclasses.MISSING:
            assert a.required, f.name
        else:
            assert not a.required and a.default == f.default, (f.name, a.default, f.default)
            assert type(a.default) is type(f.default), f.name
        kind = [t for t in typing.get_args(hints[f.name]) if t is not type(None)] or [hints[f.name]]
        if kind[0] is bool:
            assert a.nargs == 0, f"--{f.name}: a boolean field is a flag"
        elif kind[0] is not str:
            assert a.type is kind[0], f.name
    names = {f.name for f in FIELDS}
    assert set(acts) - names == {"help", "json"}


def test_the_options_before_generation_are_all_still_there() -> None:
    p = train_parser()
    got = {}
    for a in p._actions:
        for s in a.option_strings:
            if s.startswith("--") and s != "--help":
                got[s] = a.metavar if a.metavar else (
                    "{" + ",".join(a.choices) + "}" if a.choices else
                    None if a.nargs == 0 else a.dest.upper())
    for opt, metavar in BEFORE.items():
        assert opt in got, opt
        assert got[opt] == metavar, (opt, got[opt], metavar)
    groups = [[x.dest for x in g._group_actions] for g in p._mutually_exclusive_groups]
    assert groups == [["vocab", "rebuild_vocab"]]


def test_parsed_options_build_the_config(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "d").mkdir()
    base = ["train", "--target", str(tmp_path / "t"), "--data", str(tmp_path / "d"),
            "--out", str(tmp_path / "o")]
    args = build_parser().parse_args(base)
    cfg = train_cmd.config_from_args(args)
    defaults = TrainConfig(target=str(tmp_path / "t"), data=str(tmp_path / "d"),
                           out=str(tmp_path / "o"))
    assert cfg == defaults
    args = build_parser().parse_args(base + [
        "--lr", "3e-3", "--model", "m", "--precision", "fp32", "--holdout", "0",
        "--rebuild-vocab", "--weight-decay", "0.1", "--clip", "1.5", "--compile"])
    cfg = train_cmd.config_from_args(args)
    assert (cfg.lr, cfg.vllm_model, cfg.precision, cfg.holdout, cfg.rebuild_vocab,
            cfg.weight_decay, cfg.clip, cfg.compile) == (3e-3, "m", "fp32", 0, True, 0.1, 1.5,
                                                         True)
    for bad in (["--vocab", "v", "--rebuild-vocab"], ["--precision", "fp16"]):
        with pytest.raises(UsageError):
            build_parser().parse_args(base + bad)


def test_help_renders_every_option() -> None:
    text = train_parser().format_help()
    for f in FIELDS:
        flags = f.metadata.get("cli", {}).get("flags") or (train_cmd.option_name(f.name),)
        assert flags[0] in text
    assert "5% of the data" in " ".join(text.split())
