"""What a training run needs before its first step: data, target heads, draft vocab, drafter.

- The drafter starts from scratch (shapes from the target's config) or from `--finetune-from`
  in any style engine/ckpt/key_map.py detects (engine/ckpt/drafter_dir.py opens it).
- The draft vocab is `--vocab FILE`, else rebuilt from DATA (`--rebuild-vocab`, and always from
  scratch), else the finetune source's. When a finetune's vocab differs from its source's, lm_head
  rows are re-indexed by target id (engine/ckpt/vocab.py): shared tokens keep their trained rows,
  new tokens start from the target's own lm_head rows.
- Data and target must agree: hidden size, aux layer ids, and the target config hash recorded
  by prepare. A mismatch is an error naming both sides, never a silent run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from engine.ckpt.config_styles import config_from_dict
from engine.ckpt.target_config import config_dtype, config_hash
from engine.ckpt.target_weights import TargetHead, load_embedding
from engine.data.features import FeatureData
from engine.data.readers import OnlineData, open_data
from engine.data.target import Target, read_config
from engine.errors import EngineError
from engine.events import Emitter
from engine.fileio import read_json, sha256_file
from engine.model.config import aux_ids_problem, serving_default_aux_ids
from engine.model.draft import Eagle3Config, Eagle3Draft
from engine.training.checkpointing import latest_dir
from engine.training.config import DEFAULT_EAGLE_VERSION, TrainConfig


@dataclass
class Setup:
    """The pieces the loop uses (CPU tensors until the loop moves them)."""

    data: FeatureData
    draft: Eagle3Draft
    lm_head: TargetHead  # the target's [V,Ht]: its draft-vocab rows, the whole only if needed
    provenance: dict[str, Any] = field(default_factory=dict)


def sha256_bytes(*tensors: Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def data_hash(data: FeatureData) -> str:
    digest = getattr(data, "digest", None)  # a stream's: its producer's data, by content
    if isinstance(digest, str):
        return digest
    mpath = os.path.join(data.path, "manifest.json")
    if os.path.isfile(mpath):
        return sha256_file(mpath)
    if os.path.isfile(data.path):
        return sha256_file(data.path)
    names = getattr(data, "files", [])
    return hashlib.sha256("\n".join(f"{os.path.basename(p)}:{os.path.getsize(p)}"
                                    for p in names).encode()).hexdigest()


def scratch_config(tcfg: dict[str, Any], vd: int, aux: list[int],
                   eagle_version: str = DEFAULT_EAGLE_VERSION) -> Eagle3Config:
    """The drafter's shapes from the target's config (one Llama layer at the target's width);
    EAGLE 3.1 turns on `norm_before_fc` and `norm_output`."""
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
            "max_position_embeddings", "vocab_size")
    d = {k: tcfg[k] for k in keys if tcfg.get(k) is not None}
    n = int(tcfg["num_hidden_layers"])
    stored = config_dtype(tcfg) or "bfloat16"
    d.update(num_hidden_layers=1, draft_vocab_size=vd, tie_word_embeddings=False,
             target_num_hidden_layers=n, torch_dtype=stored)
    if aux != serving_default_aux_ids(n) or aux_ids_problem(aux) is not None:
        d["eagle_aux_hidden_state_layer_ids"] = aux  # what serving engines compute, else named
    cfg = config_from_dict(d)
    on = eagle_version == "3.1"
    return dataclasses.replace(cfg, norm_before_fc=on, norm_output=on)


def resumed_version(out: str) -> str | None:
    """The EAGLE flavour of the run in OUT's latest checkpoint (its config.json, ours): a run
    started before new drafters became 3.1 resumes as the 3.0 drafter it is."""
    latest = latest_dir(Path(out) / "checkpoints")
    if latest is None:
        return None
    conf = read_json(latest / "config.json")
    return "3.1" if conf.get("norm_before_fc") and conf.get("norm_output") else "3.0"


def _vocab(cfg: TrainConfig, data: FeatureData, v: int, source_vd: int | None,
           ev: Emitter) -> tuple[Tensor, Tensor, str] | None:
    """(d2t, t2d, where it came from), or None to keep the finetune source's."""
    from engine.ckpt.vocab import build_vocab, coverage, load_vocab
    if cfg.vocab:
        d2t, t2d = load_vocab(Path(cfg.vocab), v)
        return d2t, t2d, f"file {os.path.abspath(cfg.vocab)}"
    if cfg.finetune_from and not cfg.rebuild_vocab:
        return None
    vd = cfg.draft_vocab_size or source_vd or min(32000, v)
    counts = data.token_counts(v)
    d2t, t2d = build_vocab(counts, vd)
    ev.log(f"draft vocab: {vd} ids built from {data.path}, "
           f"coverage {coverage(counts, t2d) * 100:.1f}% of assistant tokens")
    return d2t, t2d, f"built from data ({vd} ids)"


def _finetune(cfg: TrainConfig, tcfg: dict[str, Any], aux: list[int], lm_head: TargetHead,
              data: FeatureData, ev: Emitter) -> tuple[Eagle3Config, dict[str, Tensor],
                                                       dict[str, Any]]:
    from engine.ckpt.checks import load_drafter
    from engine.ckpt.drafter_dir import open_checkpoint
    from engine.ckpt.hash_cache import sha256_by_name
    from engine.ckpt.vocab import new_token_ids, remap_lm_head
    assert cfg.finetune_from is not None
    src = Path(cfg.finetune_from)
    scfg, sd, det = load_drafter(src)
    v, n, ht = int(tcfg["vocab_size"]), int(tcfg["num_hidden_layers"]), int(tcfg["hidden_size"])
    if scfg.vocab_size != v:
        raise EngineError(f"--finetune-from {src}: vocab_size {scfg.vocab_size} != the target's "
                          f"{v} (a drafter for another target?)")
    if scfg.target_hidden_size != ht:
        raise EngineError(f"--finetune-from {src}: target_hidden_size {scfg.target_hidden_size} "
                          f"!= the target's hidden_size {ht}")
    if scfg.resolved_aux_layer_ids(scfg.target_num_layers or n) != aux:
        raise EngineError(f"--finetune-from {src}: aux layer ids "
                          f"{scfg.resolved_aux_layer_ids(scfg.target_num_layers or n)} differ from "
                          f"the data's {aux}")
    old_d2t = sd.get("d2t", torch.zeros(scfg.draft_vocab_size or v, dtype=torch.int64))
    files = open_checkpoint(src).weights.files
    prov: dict[str, Any] = {
        "path": str(src.resolve()), "format": det.format,
        "sha256": sha256_by_name(files)}
    vocab = _vocab(cfg, data, v, scfg.draft_vocab_size, ev)
    if vocab is not None and not torch.equal(vocab[0], old_d2t):
        new_d2t, new_t2d, _ = vocab
        new_ids = new_token_ids(old_d2t, new_d2t, v)
        rows = lm_head.rows(new_ids) if ht == scfg.hidden_size else None
        sd["lm_head.weight"], stats = remap_lm_head(sd["lm_head.weight"].float(), old_d2t,
                                                    new_d2t, v, rows)
        sd["d2t"], sd["t2d"] = new_d2t, new_t2d
        prov["vocab_remap"] = stats
        ev.log(f"vocab remap: {stats['kept']} lm_head rows kept, {stats['new']} new (from the "
               f"target's lm_head), {stats['dropped']} dropped")
    elif vocab is not None:
        sd["d2t"], sd["t2d"] = vocab[0], vocab[1]
    scfg = scfg.with_(draft_vocab_size=int(sd.get("d2t", old_d2t).numel()),
                      target_num_layers=scfg.target_num_layers or n)
    return scfg, sd, prov


def build(cfg: TrainConfig, ev: Emitter, device: torch.device) -> Setup:
    """Load data and heads, choose the vocab, and build the drafter (module docstring)."""
    from engine.ckpt.vocab import check_vocab_size
    tcfg = read_config(cfg.target)
    v, ht = int(tcfg["vocab_size"]), int(tcfg["hidden_size"])
    check_vocab_size(v, f"{cfg.target}/config.json: field 'vocab_size'")  # before [V] counts
    target: Target | None = None
    data: FeatureData
    if cfg.online and cfg.from_vllm:  # the server holds the target: read only its heads here
        from engine.capture.online_data import open_stream
        data = open_stream(cfg, ev)
        emb, head = load_embedding(cfg.target)
    elif cfg.online:
        target = Target.load(cfg.target, device=str(device))
        data = OnlineData(cfg.data, target, cfg.max_len)
        emb = target.embed_weight().detach().float().cpu()
        head = TargetHead(cfg.target, target.lm_head_weight().detach().float().cpu())
    else:
        if cfg.from_stream:
            from engine.stream.stream_data import open_stream_data
            data = open_stream_data(cfg, ev)
        else:
            data = open_data(cfg.data, target_dir=cfg.target, vocab_size=v)
        emb, head = load_embedding(cfg.target)
        want = data.meta.get("target", {}).get("config_sha256")
        if want and want != config_hash(cfg.target):
            raise EngineError(f"--data {cfg.data}: prepared with another target (manifest "
                              f"config_sha256 {want[:12]}.. != {cfg.target}'s "
                              f"{config_hash(cfg.target)[:12]}..)")
    if data.hidden_size != ht:
        raise EngineError(f"--data {cfg.data}: hidden states are {data.hidden_size} wide, the "
                          f"target's hidden_size is {ht}")
    n = int(tcfg["num_hidden_layers"])
    # data without ids (another tool's) holds the standard layers: what serving engines compute
    aux = list(data.aux_layer_ids) if data.aux_layer_ids else serving_default_aux_ids(n)
    problem = aux_ids_problem(aux)
    if problem is not None:
        raise EngineError(
            f"--data {cfg.data}: aux layer ids {aux} (a {n}-layer target) {problem}; prepare "
            "the data again (the engine picks distinct ascending layers)")
    prov: dict[str, Any] = {"data_sha256": data_hash(data), "aux_layer_ids": aux,
                            "target_config_sha256": config_hash(cfg.target)}
    if cfg.finetune_from:
        dcfg, sd, prov["finetune"] = _finetune(cfg, tcfg, aux, head, data, ev)
    else:
        vocab = _vocab(cfg, data, v, None, ev)
        assert vocab is not None
        version = cfg.eagle_version or (resumed_version(cfg.out) if cfg.resume else None)
        dcfg = scratch_config(tcfg, int(vocab[0].numel()), aux,
                              version or DEFAULT_EAGLE_VERSION)
        sd = {"d2t": vocab[0], "t2d": vocab[1]}
    torch.manual_seed(cfg.seed)  # scratch weights depend on the seed only
    draft = Eagle3Draft(dcfg)
    if draft.embed_tokens.weight.shape != emb.shape:
        raise EngineError(f"--target {cfg.target}: embedding {list(emb.shape)} does not fit the "
                          f"drafter's [{dcfg.vocab_size}, {dcfg.hidden_size}]")
    sd = {k: v_ for k, v_ in sd.items() if k != "embed_tokens.weight"}
    missing, unexpected = draft.load_state_dict({**sd, "embed_tokens.weight": emb}, strict=False)
    if unexpected:
        raise EngineError(f"--finetune-from: unexpected tensor {unexpected[0]!r}")
    if cfg.finetune_from and [k for k in missing if k not in ("d2t", "t2d")]:
        raise EngineError(f"--finetune-from: tensor {missing[0]!r} is missing")
    if "d2t" in missing and dcfg.has_vocab_map:
        raise EngineError("--finetune-from: the drafter has a draft vocab but no d2t tensor")
    draft.float()
    draft.embed_tokens.weight.requires_grad_(False)
    prov["vocab_sha256"] = sha256_bytes(draft.d2t, draft.t2d)
    prov["draft_vocab_size"] = int(dcfg.draft_vocab_size or v)
    if target is not None:
        del emb
    return Setup(data=data, draft=draft, lm_head=head, provenance=prov)

