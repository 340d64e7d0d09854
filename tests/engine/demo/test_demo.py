"""demo init: a complete offline workspace the console and the other tests build on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from engine.ckpt.checks import load_drafter
from engine.ckpt.target_config import config_hash
from engine.ckpt.vocab import build_vocab
from engine.data.conversations import read_conversations
from engine.data.readers import open_data
from engine.data.target import load_tokenizer
from tests.engine_helpers import run_engine

pytest_plugins = ("tests.demo_workspace",)


def test_workspace_contents(demo_dir: Path, demo_info: dict[str, Any]) -> None:
    for name in ("target/config.json", "target/tokenizer.json", "target/model.safetensors",
                 "data/manifest.json", "eval/manifest.json", "public-drafter/config.json",
                 "README.txt", "conversations/prompts.jsonl", "logs/vllm-serve.log"):
        assert (demo_dir / name).is_file(), name
    # the Logs pane's log: vLLM's own, serving the demo finetune (engine/demo/serve_log.py)
    from engine.demo.serve_log import recording
    assert (demo_dir / demo_info["serve_log"]).read_bytes() == recording()
    tok = load_tokenizer(str(demo_dir / "target"))
    assert tok.chat_template and tok.is_fast
    train = read_conversations(str(demo_dir / "conversations" / "train.jsonl"))
    prompts = read_conversations(str(demo_dir / "conversations" / "prompts.jsonl"))
    assert len(train) == demo_info["samples"]["train"]
    assert all(t["role"] == "user" for c in prompts for t in c.turns)
    replies = {t["content"] for c in train for t in c.turns if t["role"] == "assistant"}
    assert len(replies) > 40  # the target's replies vary with the prompt
    # replies were generated turn by turn for these prompts
    for c, p in zip(train, prompts, strict=False):
        assert [t for t in c.turns if t["role"] == "user"] == p.turns
    manifest = json.loads((demo_dir / "data" / "manifest.json").read_text())
    assert manifest["target"]["config_sha256"] == config_hash(str(demo_dir / "target"))
    assert manifest["samples"] == len(train)
    assert len(open_data(str(demo_dir / "eval"))) == demo_info["samples"]["eval"]
    readme = (demo_dir / "README.txt").read_text()
    for cmd in demo_info["commands"].values():
        assert cmd in readme
    assert "--finetune-from" in demo_info["commands"]["finetune"]


def test_public_drafter_is_eagle_style_with_another_vocab(demo_dir: Path,
                                                          demo_info: dict[str, Any]) -> None:
    with safe_open(str(demo_dir / "public-drafter" / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert any(k.startswith("midlayer.") for k in keys)
    assert not any(k.startswith("layers.") for k in keys) and "embed_tokens.weight" not in keys
    conf = json.loads((demo_dir / "public-drafter" / "config.json").read_text())
    assert conf["architectures"] == ["LlamaForCausalLMEagle3"]
    cfg, sd, det = load_drafter(demo_dir / "public-drafter")
    assert det.format == "eagle" and cfg.draft_vocab_size == demo_info["public_draft_vocab_size"]
    counts = open_data(str(demo_dir / "data")).token_counts(cfg.vocab_size)
    _, run_t2d = build_vocab(counts, demo_info["draft_vocab_size"])
    pub_ids = set((sd["d2t"] + torch.arange(sd["d2t"].numel())).tolist())
    run_ids = set(run_t2d.nonzero().flatten().tolist())
    assert pub_ids - run_ids and run_ids - pub_ids  # a finetune must remap in both directions


def test_init_refuses_an_existing_directory(demo_dir: Path) -> None:
    p = run_engine("demo", "init", str(demo_dir), check=False)
    assert p.returncode == 1
    assert p.stderr.strip() == f"error: {demo_dir}: already exists (pass --force to rebuild it)"


def test_init_accepts_events_after_the_action(demo_dir: Path) -> None:
    p = run_engine("demo", "init", str(demo_dir), "--events", check=False)
    assert p.returncode == 1
    err = json.loads(p.stdout.strip().splitlines()[-1])
    assert err["kind"] == "error" and "already exists" in err["msg"]


def test_update_adds_the_log_to_an_older_workspace(tmp_path: Path, demo_dir: Path) -> None:
    """`demo update DIR`: a workspace built before the vLLM log was part of one gets it, once;
    a folder that is no workspace is refused in one line."""
    old = tmp_path / "old"
    old.mkdir()
    (old / "demo.json").write_bytes((demo_dir / "demo.json").read_bytes())
    p = run_engine("demo", "update", str(old), "--json")
    assert json.loads(p.stdout) == {"dir": str(old), "added": ["logs/vllm-serve.log"]}
    assert (old / "logs" / "vllm-serve.log").read_bytes() == \
        (demo_dir / "logs" / "vllm-serve.log").read_bytes()
    p = run_engine("demo", "update", str(old))
    assert p.stdout.strip() == f"demo workspace in {old}: nothing to add"
    p = run_engine("demo", "update", str(tmp_path / "nothing"), check=False)
    assert p.returncode == 1 and p.stderr.strip() == (
        f"error: {tmp_path / 'nothing'}: not a demo workspace (no demo.json); build one with "
        "`python -m engine demo init DIR`")


def test_public_drafter_looks_downloaded(demo_dir: Path) -> None:
    """The public drafter stands for one downloaded from a hub: no training record of ours
    (inspect showed 'written by training … public-run' and compare 'public-run@80'), a card."""
    pub = demo_dir / "public-drafter"
    assert not (pub / "provenance.json").exists() and (pub / "README.md").is_file()
    report = json.loads(run_engine("inspect", str(pub), "--json").stdout)
    assert report["provenance"] is None


def test_update_strips_an_older_public_drafters_training_record(tmp_path: Path,
                                                                demo_dir: Path) -> None:
    old = tmp_path / "old"
    (old / "public-drafter").mkdir(parents=True)
    (old / "demo.json").write_bytes((demo_dir / "demo.json").read_bytes())
    (old / "logs").mkdir()
    (old / "logs" / "vllm-serve.log").write_text("kept\n")
    for f in ("config.json", "model.safetensors"):
        (old / "public-drafter" / f).write_bytes((demo_dir / "public-drafter" / f).read_bytes())
    (old / "public-drafter" / "provenance.json").write_text(json.dumps(
        {"engine_version": "0.1.0", "format": "eagle", "training": {"run": "/x/public-run"}}))
    p = run_engine("demo", "update", str(old), "--json")
    assert json.loads(p.stdout)["added"] == ["public-drafter/README.md (its training record "
                                             "removed)"]
    assert not (old / "public-drafter" / "provenance.json").exists()
    assert (old / "logs" / "vllm-serve.log").read_text() == "kept\n"
    report = json.loads(run_engine("inspect", str(old / "public-drafter"), "--json").stdout)
    assert report["ok"] and report["provenance"] is None
