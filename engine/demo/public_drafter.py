"""The demo's "public" drafter as a download looks: weights and config, and no training record.

`demo init` trains it here (engine/demo/workspace.py), so the trainer's export left our own
provenance.json in it, and inspect and compare showed it as "written by training … public-run",
`public-run@80`: not what a user who downloaded a drafter sees. A hub drafter carries a model
card at most; this puts that card in place of our record. Torch-free: `demo update` runs it on a
workspace built by an older engine and must stay quick."""

from __future__ import annotations

from pathlib import Path

from engine.fileio import read_json, write_text

DIR = "public-drafter"

CARD = """\
# public-drafter (eagle3-console demo)

An EAGLE-3 drafter for the demo target, laid out as one downloads it from a model hub:
`config.json` (EAGLE style, `LlamaForCausalLMEagle3`) and `model.safetensors` (`midlayer.*`
keys, its own draft vocabulary), and no training record. The demo's finetune starts from it
(`--finetune-from`); `inspect` shows what it is and compare labels it by this folder's name.
"""


def as_downloaded(workspace: str | Path) -> bool:
    """Replace our training record in WORKSPACE/public-drafter by a model card; whether
    anything changed. Only a provenance.json this engine wrote is removed."""
    d = Path(workspace) / DIR
    record = d / "provenance.json"
    changed = False
    if record.is_file() and "engine_version" in read_json(record):
        record.unlink()
        changed = True
    if d.is_dir() and not (d / "README.md").exists():
        write_text(d / "README.md", CARD)
        changed = True
    return changed
