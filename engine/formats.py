"""Checkpoint styles, one import away: a re-export of the modules that do the work.

    engine/key_map.py        the key-map adapter: LAYER_PREFIX, to_*/from_* (torchtitan-style),
                             detect(), and target_heads() (where a target keeps its embedding and
                             lm_head)
    engine/drafter_dir.py    read_config, Checkpoint, open_checkpoint (nothing loaded eagerly)
    engine/checks.py         expected_tensors, run_checks, require_checks, load_drafter,
                             export_checks
    engine/drafter_save.py   config_for, build_provenance (shared with convert), save_drafter
    engine/target_weights.py the target's embedding and lm_head read from its weight files
    engine/output_dir.py     atomic_output_dir (what an output may delete)
Engine modules import from those directly; this module keeps old callers (and tests) working.
"""

from __future__ import annotations

from engine.checks import (
    Check,
    Expect,
    expected_tensors,
    export_checks,
    load_drafter,
    require_checks,
    run_checks,
)
from engine.drafter_dir import Checkpoint, open_checkpoint, read_config
from engine.drafter_save import (
    build_provenance,
    cast_code,
    config_for,
    save_drafter,
    torch_name,
    write_json,
)
from engine.key_map import (
    CANONICAL,
    EXPORT_TARGETS,
    IGNORED_SUFFIXES,
    LAYER_PREFIX,
    STYLES,
    TARGET_EMBED_NAMES,
    TARGET_HEAD_NAMES,
    Detected,
    detect,
    from_canonical,
    from_eagle,
    from_speculators,
    output_style,
    target_heads,
    to_canonical,
    to_eagle,
    to_speculators,
)
from engine.output_dir import atomic_output_dir
from engine.target_weights import (
    find_target_heads,
    load_target_embedding,
    target_embedding_entry,
)

__all__ = [
    "CANONICAL", "EXPORT_TARGETS", "IGNORED_SUFFIXES", "LAYER_PREFIX", "STYLES",
    "TARGET_EMBED_NAMES", "TARGET_HEAD_NAMES", "Check", "Checkpoint", "Detected", "Expect",
    "atomic_output_dir", "cast_code", "config_for", "detect", "expected_tensors", "export_checks",
    "find_target_heads", "from_canonical", "from_eagle", "from_speculators", "load_drafter",
    "load_target_embedding", "open_checkpoint", "output_style", "build_provenance",
    "read_config",
    "require_checks", "run_checks", "save_drafter", "target_embedding_entry", "target_heads",
    "to_canonical", "to_eagle", "to_speculators", "torch_name", "write_json",
]
