"""EAGLE 3.1 (`norm_before_fc`, `fc_norm`, `norm_output`): read, run, written.

The exactness test writes a drafter the way speculators 0.9 does with its defaults (speculators
config style, `layers.0.*` names, `embed_tokens` stored, `norm_before_fc` and `norm_output` true)
with safetensors itself, and checks our TTT logits against `reference_ttt_logits`: a plain loop
over positions written from the EAGLE-3 math (engine/model/draft.py's docstring states it; the
three flags as engine/model/config.py's field docstrings define them), sharing no code with
engine/.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.ckpt.checks import export_checks, load_drafter, run_checks
from engine.ckpt.config_styles import (
    NORM_OUTPUT_ENV,
    config_from_dict,
    to_eagle_dict,
    to_speculators_dict,
)
from engine.ckpt.drafter_dir import open_checkpoint
from engine.errors import EngineError
from engine.model.draft import Eagle3Draft
from tests.drafters import random_state, tiny_config

pytest_plugins = ("tests.demo_workspace",)

SPECULATORS_09_FLAGS = {"norm_before_fc": True, "fc_norm": False, "norm_output": True}


# -- the reference (the math written out, float64, one query at a time) --------------------------

def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def _rope(x: torch.Tensor, pos: int, theta: float) -> torch.Tensor:
    """x [heads, hd] at integer position pos, rotate-half layout."""
    hd = x.shape[-1]
    freq = torch.tensor([theta ** (-2 * j / hd) for j in range(hd // 2)], dtype=x.dtype)
    ang = torch.cat([pos * freq, pos * freq])
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * ang.cos() + torch.cat([-x2, x1], -1) * ang.sin()


def reference_ttt_logits(w: dict[str, torch.Tensor], conf: dict, aux: torch.Tensor,
                         ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Per step i, logits [T, Vd] (rows whose input token t+1+i is past the ids are NaN):
    speculators-layout weights `w`, speculators-style config `conf`, aux [T, 3Ht], ids [>=T] (one
    sequence; position t reads aux t and token t+1+i at step i, teacher-forced)."""
    lc = conf["transformer_layer_config"]
    eps, theta = lc["rms_norm_eps"], lc["rope_theta"]
    nh, nkv, hd = lc["num_attention_heads"], lc["num_key_value_heads"], lc["head_dim"]
    w = {k: v.double() for k, v in w.items()}
    L = "layers.0."
    x = aux.double()
    if conf.get("norm_before_fc"):
        x = _rms(x, w["input_norm.weight"], eps)
    h = x @ w["fc.weight"].T  # [T, H]
    t_len, n_ids = aux.shape[0], ids.shape[0]
    keys: list[list[torch.Tensor]] = []  # keys[step][t] [nkv, hd]
    vals: list[list[torch.Tensor]] = []
    out_logits = []
    for i in range(steps):
        ks, vs, outs, lgs = [], [], [], []
        for t in range(t_len):
            tok = ids[t + 1 + i] if t + 1 + i < n_ids else ids[-1]
            e = _rms(w["embed_tokens.weight"][tok], w[L + "input_layernorm.weight"], eps)
            hn = _rms(h[t], w[L + "hidden_norm.weight"], eps)
            inp = torch.cat([e, hn])  # embedding first, hidden second
            ks.append(_rope((w[L + "self_attn.k_proj.weight"] @ inp).view(nkv, hd), t + i, theta))
            vs.append((w[L + "self_attn.v_proj.weight"] @ inp).view(nkv, hd))
        keys.append(ks)
        vals.append(vs)
        for t in range(t_len):
            tok = ids[t + 1 + i] if t + 1 + i < n_ids else ids[-1]
            e = _rms(w["embed_tokens.weight"][tok], w[L + "input_layernorm.weight"], eps)
            hn = _rms(h[t], w[L + "hidden_norm.weight"], eps)
            inp = torch.cat([e, hn])
            q = _rope((w[L + "self_attn.q_proj.weight"] @ inp).view(nh, hd), t + i, theta)
            seen = [(keys[0][s], vals[0][s]) for s in range(t + 1)]
            seen += [(keys[j][t], vals[j][t]) for j in range(1, i + 1)]
            heads = []
            for a in range(nh):
                g = a // (nh // nkv)
                sc = torch.stack([k[g] @ q[a] for k, _ in seen]) / math.sqrt(hd)
                heads.append((sc.softmax(0)[:, None] * torch.stack([v[g] for _, v in seen])).sum(0))
            attn = w[L + "self_attn.o_proj.weight"] @ torch.cat(heads)
            residual = hn if conf["norm_before_residual"] else h[t]
            h1 = residual + attn
            m = _rms(h1, w[L + "post_attention_layernorm.weight"], eps)
            mlp = w[L + "mlp.down_proj.weight"] @ (
                torch.nn.functional.silu(w[L + "mlp.gate_proj.weight"] @ m)
                * (w[L + "mlp.up_proj.weight"] @ m))
            out = h1 + mlp
            normed = _rms(out, w["norm.weight"], eps)
            lgs.append(w["lm_head.weight"] @ normed)
            outs.append(normed if conf.get("norm_output") else out)
        lg = torch.stack(lgs)
        lg[torch.arange(t_len) + 1 + i >= n_ids] = float("nan")
        out_logits.append(lg)
        h = torch.stack(outs)
    return out_logits


def _speculators_layout(d: Path, norm_before_residual: bool = False) -> dict[str, torch.Tensor]:
    """A drafter directory as speculators 0.9 saves one with its defaults; returns its tensors
    under their stored names."""
    cfg = tiny_config(norm_before_fc=True)
    state = random_state(cfg, seed=3, embed=True)
    for k in [k for k in state if k.endswith("norm.weight")]:  # norms away from 1
        state[k] = 1 + 0.3 * torch.randn_like(state[k])
    for k in [k for k in state if "proj" in k or k in ("fc.weight", "lm_head.weight")]:
        state[k] = state[k] * 0.2
    stored = {(k.replace("midlayer.", "layers.0.")): v.contiguous() for k, v in state.items()}
    layer = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
             "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
             "num_attention_heads": cfg.num_attention_heads,
             "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
             "num_hidden_layers": 1, "hidden_act": "silu", "rms_norm_eps": cfg.rms_norm_eps,
             "rope_theta": cfg.rope_theta, "max_position_embeddings": 512,
             "vocab_size": cfg.vocab_size, "tie_word_embeddings": False}
    conf = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
            "transformer_layer_config": layer, "draft_vocab_size": cfg.draft_vocab_size,
            "norm_before_residual": norm_before_residual, **SPECULATORS_09_FLAGS,
            "target_hidden_size": None, "eagle_aux_hidden_state_layer_ids": [2, 4, 5],
            "speculators_version": "0.9.0",
            "speculators_config": {"algorithm": "eagle3", "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": "tiny/target", "architectures": []}},
            "torch_dtype": "float32"}
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(conf))
    save_file(stored, str(d / "model.safetensors"))
    return stored


@pytest.mark.parametrize("nbr", [False, True])
def test_speculators_09_default_drafter_logits_match_reference(tmp_path: Path, nbr: bool) -> None:
    stored = _speculators_layout(tmp_path / "d", norm_before_residual=nbr)
    cfg, sd, _ = load_drafter(tmp_path / "d")
    assert (cfg.norm_before_fc, cfg.fc_norm, cfg.norm_output) == (True, False, True)
    m = Eagle3Draft(cfg).double()
    missing, unexpected = m.load_state_dict(sd, strict=False)
    assert not missing and not unexpected
    torch.manual_seed(1)
    t, k = 12, 3
    aux = torch.randn(1, t, 3 * cfg.target_hidden_size, dtype=torch.float64)  # type: ignore
    ids = torch.randint(0, cfg.vocab_size, (1, t))
    conf = json.loads((tmp_path / "d" / "config.json").read_text())
    ref = reference_ttt_logits(stored, conf, aux[0], ids[0], k)
    for impl in ("split", "dense"):
        m.attn_impl = impl
        with torch.no_grad():
            ours = m.ttt_forward(aux, ids, k)
        for i in range(k):
            ok = ~ref[i].isnan().any(-1)
            assert (ours[i][0][ok] - ref[i][ok]).abs().max() < 1e-5, (impl, i)
    # norm_output off runs another function: the check can fail
    m.config.norm_output = False
    with torch.no_grad():
        off = m.ttt_forward(aux, ids, k)
    ok = ~ref[1].isnan().any(-1)
    assert (off[1][0][ok] - ref[1][ok]).abs().max() > 1e-3


def test_draft_greedy_follows_norm_output(tmp_path: Path) -> None:
    """The greedy chain hands on the post-norm state too: its drafts equal the argmax of the TTT
    unroll fed with its own drafts (draft_greedy_all's row p == draft_greedy of prefix p)."""
    _speculators_layout(tmp_path / "d")
    cfg, sd, _ = load_drafter(tmp_path / "d")
    m = Eagle3Draft(cfg).double()
    m.load_state_dict(sd, strict=False)
    torch.manual_seed(2)
    t = 10
    aux = torch.randn(1, t, 3 * cfg.target_hidden_size, dtype=torch.float64)  # type: ignore
    ids = torch.randint(0, cfg.vocab_size, (1, t + 1))
    drafts = m.draft_greedy(aux, ids, 3)[0]
    # teacher-force the chain's own drafts through the reference: same tokens at every step
    conf = json.loads((tmp_path / "d" / "config.json").read_text())
    w = {k.replace("midlayer.", "layers.0."): v for k, v in sd.items()}
    seq = torch.cat([ids[0], drafts[:2]])  # drafts 1, 2 as steps 1, 2's input tokens
    pad = aux[0, -1:].expand(2, -1)  # positions after T-1: causally unseen by it
    ref = reference_ttt_logits(w, conf, torch.cat([aux[0], pad]), seq, 3)
    got = [int(m.to_target_ids(ref[i][t - 1].argmax())) for i in range(3)]
    assert got == drafts.tolist()


def test_flags_round_trip_every_style(tmp_path: Path) -> None:
    _speculators_layout(tmp_path / "d")
    ck = open_checkpoint(tmp_path / "d")
    flags = next(c for c in run_checks(ck) if c.name == "norm_flags")
    assert flags.detail.startswith("norm_before_fc true · fc_norm false · norm_output true")
    spec = to_speculators_dict(ck.config)
    assert {k: spec[k] for k in SPECULATORS_09_FLAGS} == SPECULATORS_09_FLAGS
    eagle = to_eagle_dict(ck.config)
    assert eagle["norm_output"] is True and eagle["norm_before_fc"] is True
    assert "fc_norm" not in eagle
    back = config_from_dict(spec)
    assert (back.norm_before_fc, back.norm_output) == (True, True)
    with pytest.raises(EngineError, match="sglang: norm_output"):
        export_checks(ck.config, list(ck.stored), "sglang")


def test_inspect_states_the_flags_it_runs_and_the_style_it_reads(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A speculators 0.9 drafter and its vllm export: the summary line, the checks and
    `--json`'s config agree (true where the config says so, in JSON's spelling), and the
    export is named as the style its writer made it, beside the files' format."""
    from engine.cli import main
    _speculators_layout(tmp_path / "s")
    assert main(["convert", str(tmp_path / "s"), str(tmp_path / "v"), "--to", "vllm"]) == 0
    want = {**SPECULATORS_09_FLAGS, "norm_before_residual": False}
    for d, head in (("s", "speculators format (names speculators"),
                    ("v", "vllm export of eagle format (names eagle")):
        capsys.readouterr()
        assert main(["inspect", str(tmp_path / d)]) == 0
        text = capsys.readouterr().out
        assert text.startswith(f"{tmp_path / d}: {head}"), text.splitlines()[0]
        assert "norm_before_fc true  fc_norm false  norm_output true  norm_before_residual " \
               "false\n" in text
        assert "norm_flags            norm_before_fc true · fc_norm false · norm_output true" \
            in text
        assert "True" not in text and "False" not in text
        assert main(["inspect", str(tmp_path / d), "--json"]) == 0
        r = json.loads(capsys.readouterr().out)
        assert {k: r["config"][k] for k in want} == want
        assert (r["format"], r["style"]) == (("speculators",) * 2 if d == "s" else
                                             ("eagle", "vllm"))


def test_flat_norm_output_needs_its_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    conf = to_eagle_dict(tiny_config())
    conf["norm_output"] = True
    with pytest.raises(EngineError, match=NORM_OUTPUT_ENV):
        config_from_dict(conf)
    assert config_from_dict(conf, norm_output_meaning="speculators").norm_output
    assert not config_from_dict(conf, norm_output_meaning="specforge").norm_output
    with pytest.raises(EngineError, match="SpecForge"):
        config_from_dict({**conf, "norm_output": False}, norm_output_meaning="specforge")
    # on disk: refused without a writer, ours by its provenance, others by the variable
    d = tmp_path / "d"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(conf))
    save_file({k: v.contiguous() for k, v in random_state(tiny_config()).items()},
              str(d / "model.safetensors"))
    monkeypatch.delenv(NORM_OUTPUT_ENV, raising=False)
    with pytest.raises(EngineError, match=f"config.json: .*{NORM_OUTPUT_ENV}"):
        open_checkpoint(d)
    (d / "provenance.json").write_text(json.dumps({"engine_version": "0", "format": "vllm"}))
    assert open_checkpoint(d).config.norm_output
    (d / "provenance.json").unlink()
    monkeypatch.setenv(NORM_OUTPUT_ENV, "specforge")
    assert not open_checkpoint(d).config.norm_output


# -- new drafters: EAGLE 3.1 by default, 3.0 on request; a finetune keeps its source's flags ------

def _flags(final: Path) -> dict[str, bool]:
    conf = json.loads((final / "config.json").read_text(encoding="utf-8"))
    return {k: bool(conf.get(k, False)) for k in ("norm_before_fc", "norm_output")}


def test_scratch_run_is_eagle31_by_default_and_30_on_request(demo_dir: Path, tmp_path: Path
                                                            ) -> None:
    from tests.engine_helpers import run_engine, train_args
    runs = {v: tmp_path / f"scratch-{v or 'default'}" for v in (None, "3.0")}
    for v, out in runs.items():
        run_engine(*train_args(demo_dir, out, "--max-steps", "2", "--save-every", "0",
                               *(["--eagle-version", v] if v else [])))
    assert _flags(runs[None] / "final") == {"norm_before_fc": True, "norm_output": True}
    assert _flags(runs["3.0"] / "final") == {"norm_before_fc": False, "norm_output": False}
    # the exported 3.1 drafter loads back with both flags (vLLM's reading of the export)
    cfg = open_checkpoint(runs[None] / "final").config
    assert (cfg.norm_before_fc, cfg.norm_output) == (True, True)
    # a finetune keeps its source's flags: asking for a flavour there is refused by name
    p = run_engine(*train_args(demo_dir, tmp_path / "ft", "--max-steps", "1",
                               "--finetune-from", str(runs["3.0"] / "final"),
                               "--eagle-version", "3.1"), check=False)
    assert p.returncode != 0
    assert "--eagle-version" in p.stderr and "finetune" in p.stderr
    assert not (tmp_path / "ft" / "final").exists()


def test_a_run_from_before_31_resumes_as_the_30_drafter_it_is(demo_dir: Path, tmp_path: Path
                                                              ) -> None:
    """A scratch run an older engine started (3.0: no flags, no `eagle_version` in its
    recorded settings) resumes under the 3.1 default without a tensor mismatch, still 3.0."""
    from tests.engine_helpers import run_engine, train_args
    out = tmp_path / "run"
    run_engine(*train_args(demo_dir, out, "--max-steps", "2", "--save-every", "1",
                           "--eagle-version", "3.0"))
    for trainer in (out / "checkpoints").glob("step_*/trainer.json"):
        t = json.loads(trainer.read_text(encoding="utf-8"))
        del t["settings"]["eagle_version"]   # as an engine before the option wrote it
        trainer.write_text(json.dumps(t), encoding="utf-8")
    shutil.rmtree(out / "final")   # the resumed run writes it again
    p = run_engine(*train_args(demo_dir, out, "--max-steps", "2", "--save-every", "1",
                               "--resume"), check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    assert _flags(out / "final") == {"norm_before_fc": False, "norm_output": False}
