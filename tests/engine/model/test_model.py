"""The draft model: TTT attention against a slow loop reference, greedy drafting, RoPE, shapes."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

from engine.ckpt.config_styles import config_from_dict, to_eagle_dict, to_speculators_dict
from engine.errors import EngineError
from engine.model.draft import (
    Eagle3Config,
    Eagle3Draft,
    inv_freq,
    preset,
    shift_left,
    valid_positions,
)


def _tiny(**changes: object) -> Eagle3Config:
    return preset("tiny").with_(**changes)


def _model(cfg: Eagle3Config, seed: int = 0) -> Eagle3Draft:
    torch.manual_seed(seed)
    m = Eagle3Draft(cfg).double()
    with torch.no_grad():  # non-trivial norms, so a swapped norm would show
        for name, p in m.named_parameters():
            if name.endswith("norm.weight") or ".norm" in name or name.startswith("norm"):
                p.uniform_(0.5, 1.5)
        m.embed_tokens.weight.normal_()
    return m


# -- a slow, literal reference of the draft layer and the TTT objective -------------------------

def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * x / torch.sqrt((x * x).mean() + eps)


def _rope_vec(x: torch.Tensor, pos: int, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate one head vector [hd] by position `pos`, pair (i, i + hd/2) as in HF Llama."""
    half = x.shape[0] // 2
    out = x.clone()
    for i in range(half):
        a = pos * float(freqs[i])
        c, s = math.cos(a), math.sin(a)
        out[i] = x[i] * c - x[i + half] * s
        out[i + half] = x[i + half] * c + x[i] * s
    return out


def reference_ttt(m: Eagle3Draft, aux: torch.Tensor, ids: torch.Tensor, steps: int
                  ) -> list[torch.Tensor]:
    """Per batch row, per step, per position, per head: explicit loops, one softmax per query."""
    cfg = m.config
    eps, nh, nkv, hd = cfg.rms_norm_eps, cfg.num_attention_heads, cfg.num_key_value_heads, \
        cfg.head_dim
    freqs = inv_freq(cfg)[0].double()
    B, T, _ = aux.shape
    logits = [torch.zeros(B, T, cfg.draft_vocab_size, dtype=torch.float64) for _ in range(steps)]
    W = {n: p.detach() for n, p in m.named_parameters()}
    for b in range(B):
        h = [W["fc.weight"] @ aux[b, t] for t in range(T)]
        keys: list[list[torch.Tensor]] = []  # keys[step][t] -> [nkv, hd]
        vals: list[list[torch.Tensor]] = []
        for i in range(steps):
            qs, ks, vs, resid = [], [], [], []
            for t in range(T):
                tok = int(ids[b, t + 1 + i]) if t + 1 + i < T else 0
                e = W["embed_tokens.weight"][tok]
                x = torch.cat([_rms(e, W["midlayer.input_layernorm.weight"], eps),
                               _rms(h[t], W["midlayer.hidden_norm.weight"], eps)])
                q = (W["midlayer.self_attn.q_proj.weight"] @ x).view(nh, hd)
                k = (W["midlayer.self_attn.k_proj.weight"] @ x).view(nkv, hd)
                v = (W["midlayer.self_attn.v_proj.weight"] @ x).view(nkv, hd)
                qs.append(torch.stack([_rope_vec(q[n], t + i, freqs) for n in range(nh)]))
                ks.append(torch.stack([_rope_vec(k[n], t + i, freqs) for n in range(nkv)]))
                vs.append(v)
                resid.append(h[t])
            keys.append(ks)
            vals.append(vs)
            new_h = []
            for t in range(T):
                heads = []
                for n in range(nh):
                    g = n // (nh // nkv)
                    cand_k = [keys[0][s][g] for s in range(t + 1)]
                    cand_v = [vals[0][s][g] for s in range(t + 1)]
                    for j in range(1, i + 1):
                        cand_k.append(keys[j][t][g])
                        cand_v.append(vals[j][t][g])
                    scores = torch.stack([qs[t][n] @ kk for kk in cand_k]) / math.sqrt(hd)
                    p = torch.softmax(scores, dim=0)
                    heads.append(sum(pi * vv for pi, vv in zip(p, cand_v, strict=False)))
                a = W["midlayer.self_attn.o_proj.weight"] @ torch.cat(heads)
                h1 = resid[t] + a
                y = _rms(h1, W["midlayer.post_attention_layernorm.weight"], eps)
                mlp = W["midlayer.mlp.down_proj.weight"] @ (
                    F.silu(W["midlayer.mlp.gate_proj.weight"] @ y)
                    * (W["midlayer.mlp.up_proj.weight"] @ y))
                out = h1 + mlp
                new_h.append(out)
                logits[i][b, t] = W["lm_head.weight"] @ _rms(out, W["norm.weight"], eps)
            h = new_h
    return logits


@pytest.mark.parametrize("rope", [None, {"rope_type": "llama3", "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 4}])
def test_ttt_forward_matches_loop_reference(rope: dict | None) -> None:
    cfg = _tiny(hidden_size=32, intermediate_size=48, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, target_hidden_size=24, vocab_size=50,
                draft_vocab_size=20, rope_scaling=rope)
    m = _model(cfg)
    torch.manual_seed(1)
    B, T, K = 2, 6, 4
    aux = torch.randn(B, T, 3 * 24, dtype=torch.float64)
    ids = torch.randint(0, 50, (B, T))
    got = m.ttt_forward(aux, ids, K)
    want = reference_ttt(m, aux, ids, K)
    assert len(got) == K
    for i in range(K):
        assert got[i].shape == (B, T, 20)
        torch.testing.assert_close(got[i], want[i], rtol=1e-9, atol=1e-9)


def test_ttt_never_sees_the_future() -> None:
    """Step i at position t reads tokens up to t+1+i and features up to t, nothing later."""
    cfg = _tiny(hidden_size=32, intermediate_size=48, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, target_hidden_size=32, vocab_size=50,
                draft_vocab_size=20)
    m = _model(cfg)
    T, K = 8, 3
    aux = torch.randn(1, T, 96, dtype=torch.float64)
    ids = torch.randint(0, 50, (1, T))
    base = m.ttt_forward(aux, ids, K)
    ids2 = ids.clone()
    ids2[0, 5] = (ids[0, 5] + 1) % 50  # token 5 is first read by step i at position 4 - i
    aux2 = aux.clone()
    aux2[0, 6] += 1.0  # feature 6 is first read at position 6, every step
    for changed, first in ((m.ttt_forward(aux, ids2, K), lambda i: 4 - i),
                           (m.ttt_forward(aux2, ids, K), lambda i: 6)):
        for i in range(K):
            f = first(i)
            torch.testing.assert_close(changed[i][0, :f], base[i][0, :f])
            assert not torch.allclose(changed[i][0, f], base[i][0, f])


def test_padding_mask_hides_padded_keys() -> None:
    cfg = _tiny()
    m = _model(cfg)
    aux = torch.randn(2, 7, 3 * cfg.hidden_size, dtype=torch.float64)
    ids = torch.randint(0, cfg.vocab_size, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0  # row 1 is right-padded
    full = m.ttt_forward(aux, ids, 3, attention_mask=mask)
    short = m.ttt_forward(aux[1:, :5], ids[1:, :5], 3)
    # Real positions whose inputs lie inside the unpadded part agree exactly.
    for i in range(3):
        ok = valid_positions(5, i)
        torch.testing.assert_close(full[i][1, :5][ok], short[i][0][ok])


def test_gradients_reach_trainable_weights_not_embedding() -> None:
    cfg = _tiny()
    m = Eagle3Draft(cfg)
    aux = torch.randn(1, 8, 3 * cfg.hidden_size)
    ids = torch.randint(0, cfg.vocab_size, (1, 8))
    loss = sum(x.logsumexp(-1).mean() for x in m.ttt_forward(aux, ids, 3))
    loss.backward()
    assert m.embed_tokens.weight.grad is None
    assert m.fc.weight.grad is not None and m.fc.weight.grad.abs().sum() > 0
    assert "embed_tokens.weight" not in m.trainable_state_dict()
    assert {"d2t", "t2d"} <= set(m.trainable_state_dict())
    assert not any("inv_freq" in k for k in m.state_dict())


def test_draft_greedy_equals_ttt_on_its_own_tokens() -> None:
    """A greedy chain is the TTT unroll read at the last prefix position with drafts as input."""
    cfg = _tiny()
    m = _model(cfg)
    # A non-trivial vocab map: draft id i -> target id 3*i + 1.
    vd = cfg.draft_vocab_size
    targets = torch.arange(vd) * 3 + 1
    m.d2t.copy_(targets - torch.arange(vd))
    m.t2d.zero_()
    m.t2d[targets] = True
    B, T, k = 2, 9, 4
    aux = torch.randn(B, T, 3 * cfg.hidden_size, dtype=torch.float64)
    ids = torch.randint(0, cfg.vocab_size, (B, T + 1))
    drafts = m.draft_greedy(aux, ids, k)
    assert drafts.shape == (B, k)
    assert bool(m.t2d[drafts].all())  # every draft is a target id inside the draft vocab
    # Extend the sequence with the drafts; aux beyond T-1 is never seen by position T-1.
    seq = torch.cat([ids, drafts[:, :-1]], dim=1)  # [B, T+1+k-1]
    pad = torch.randn(B, seq.shape[1] - T, 3 * cfg.hidden_size, dtype=torch.float64)
    logits = m.ttt_forward(torch.cat([aux, pad], dim=1), seq, k)
    for i in range(k):
        want = m.to_target_ids(logits[i][:, T - 1].argmax(-1))
        assert torch.equal(want, drafts[:, i])


def test_draft_greedy_all_is_draft_greedy_from_every_prefix() -> None:
    """The batched eval path: row p of draft_greedy_all equals draft_greedy on prefix p (GQA)."""
    cfg = _tiny()
    assert cfg.num_key_value_heads is not None and cfg.num_key_value_heads < cfg.num_attention_heads
    m = _model(cfg, seed=3)
    vd = cfg.draft_vocab_size
    targets = torch.arange(vd) * 3 + 1  # a non-trivial vocab map
    m.d2t.copy_(targets - torch.arange(vd))
    B, T, k = 2, 11, 4
    aux = torch.randn(B, T, 3 * cfg.hidden_size, dtype=torch.float64)
    ids = torch.randint(0, cfg.vocab_size, (B, T + 1))
    every = m.draft_greedy_all(aux, ids, k)
    assert every.shape == (B, T, k)
    for p in range(T):
        assert torch.equal(every[:, p], m.draft_greedy(aux[:, :p + 1], ids[:, :p + 2], k)), p


def test_shift_helpers() -> None:
    x = torch.tensor([[1, 2, 3, 4]])
    assert shift_left(x, 1).tolist() == [[2, 3, 4, 0]]
    assert shift_left(x, 2, fill=-1).tolist() == [[3, 4, -1, -1]]
    assert shift_left(x, 9).tolist() == [[0, 0, 0, 0]]
    assert valid_positions(4, 0).tolist() == [True, True, True, False]
    assert valid_positions(4, 2).tolist() == [True, False, False, False]


# -- RoPE against transformers' own tables -------------------------------------------------------

@pytest.mark.parametrize("rope", [
    None,
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
])
def test_inv_freq_matches_transformers(rope: dict | None) -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = preset("llama3-8b").with_(rope_scaling=rope, max_position_embeddings=131072)
    ours, scale = inv_freq(cfg)
    params = {"rope_type": "default", "rope_theta": cfg.rope_theta, **(rope or {})}
    hf_cfg = LlamaConfig(hidden_size=4096, num_attention_heads=32, head_dim=128,
                         max_position_embeddings=131072, rope_parameters=params)
    kind = params["rope_type"]
    if kind == "default":
        want = 1.0 / (cfg.rope_theta ** (torch.arange(0, 128, 2).float() / 128))
        want_scale = 1.0
    else:
        want, want_scale = ROPE_INIT_FUNCTIONS[kind](hf_cfg, "cpu")
    torch.testing.assert_close(ours, want.float(), rtol=1e-5, atol=0)
    assert scale == pytest.approx(want_scale)


# -- shapes and config ---------------------------------------------------------------------------

def test_llama31_8b_shapes_on_meta_device() -> None:
    cfg = preset("llama3-8b")
    with torch.device("meta"):
        m = Eagle3Draft(cfg)
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert shapes["midlayer.self_attn.q_proj.weight"] == (4096, 8192)
    assert shapes["midlayer.self_attn.k_proj.weight"] == (1024, 8192)
    assert shapes["midlayer.self_attn.v_proj.weight"] == (1024, 8192)
    assert shapes["midlayer.self_attn.o_proj.weight"] == (4096, 4096)
    assert shapes["fc.weight"] == (4096, 12288)
    assert shapes["lm_head.weight"] == (32000, 4096)
    assert shapes["embed_tokens.weight"] == (128256, 4096)
    assert shapes["midlayer.mlp.gate_proj.weight"] == (14336, 4096)
    assert shapes["midlayer.mlp.down_proj.weight"] == (4096, 14336)
    assert shapes["d2t"] == (32000,) and m.d2t.dtype == torch.int64
    assert shapes["t2d"] == (128256,) and m.t2d.dtype == torch.bool
    for n in ("midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
              "midlayer.post_attention_layernorm.weight", "norm.weight"):
        assert shapes[n] == (4096,)
    assert len(shapes) == 16


def test_kimi_preset_shapes_on_meta_device() -> None:
    with torch.device("meta"):
        m = Eagle3Draft(preset("kimi-k2"))
    assert tuple(m.fc.weight.shape) == (7168, 3 * 7168)
    assert tuple(m.midlayer.self_attn.q_proj.weight.shape) == (56 * 128, 2 * 7168)
    assert tuple(m.lm_head.weight.shape) == (32000, 7168)
    assert tuple(m.t2d.shape) == (163840,)


def test_config_styles_round_trip() -> None:
    cfg = preset("llama3-8b").with_(aux_layer_ids=[1, 16, 29], target_hidden_size=5120)
    e = to_eagle_dict(cfg)
    assert e["architectures"] == ["LlamaForCausalLMEagle3"]
    assert e["tie_word_embeddings"] is False and "norm_output" not in e
    assert e["vocab_size"] == 128256 and e["draft_vocab_size"] == 32000
    assert e["eagle_aux_hidden_state_layer_ids"] == [1, 16, 29]
    assert e["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 15, 28]  # SGLang reading
    s = to_speculators_dict(cfg, verifier="meta-llama/Llama-3.1-8B-Instruct", speculative_tokens=5)
    assert s["norm_before_residual"] is False
    assert s["transformer_layer_config"]["vocab_size"] == 128256
    assert s["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5
    assert s["speculators_config"]["verifier"]["name_or_path"] == \
        "meta-llama/Llama-3.1-8B-Instruct"
    back = config_from_dict(s)
    assert to_eagle_dict(back) == e
    assert config_from_dict(e) == cfg.with_(verifier=None, verifier_architectures=None)


def test_default_aux_ids_are_omitted() -> None:
    cfg = preset("llama3-8b").with_(aux_layer_ids=[2, 16, 29])  # the defaults for N = 32
    assert "eagle_aux_hidden_state_layer_ids" not in to_eagle_dict(cfg)
    assert to_speculators_dict(cfg)["eagle_aux_hidden_state_layer_ids"] is None
    assert preset("llama3-8b").resolved_aux_layer_ids() == [2, 16, 29]


def test_sglang_style_aux_ids_are_read_as_outputs() -> None:
    d = to_eagle_dict(preset("tiny"))
    d["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}
    assert config_from_dict(d).aux_layer_ids == [2, 3, 4]


def test_speculators_without_norm_before_residual_is_read_as_vllm_does() -> None:
    d = to_speculators_dict(preset("tiny"), verifier="x")
    del d["norm_before_residual"]
    cfg = config_from_dict(d)
    assert cfg.norm_before_residual is True
    with pytest.raises(EngineError, match="norm_before_residual"):
        to_eagle_dict(cfg)


@pytest.mark.parametrize("change,field", [
    ({"hidden_size": 0}, "hidden_size"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"draft_vocab_size": 10_000}, "draft_vocab_size"),
    ({"rope_scaling": {"rope_type": "longrope"}}, "rope_scaling"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
    ({"aux_layer_ids": [1, 2]}, "eagle_aux_hidden_state_layer_ids"),
    ({"torch_dtype": "int8"}, "torch_dtype"),
])
def test_config_validation_names_the_field(change: dict, field: str) -> None:
    with pytest.raises(EngineError, match=field):
        preset("tiny").with_(**change)


def test_from_dict_names_missing_and_bad_fields() -> None:
    d = to_eagle_dict(preset("tiny"))
    del d["intermediate_size"]
    with pytest.raises(EngineError, match="'intermediate_size': missing"):
        config_from_dict(d)
    d = to_eagle_dict(preset("tiny"))
    d["hidden_act"] = "gelu"
    with pytest.raises(EngineError, match="hidden_act"):
        config_from_dict(d)
    d = to_speculators_dict(preset("tiny"))
    d["transformer_layer_config"] = "nope"
    with pytest.raises(EngineError, match="transformer_layer_config"):
        config_from_dict(d)


@pytest.mark.parametrize(("name", "style", "key", "value", "field"), [
    ("tiny", "speculators", "speculators_config.proposal_methods", 3,
     "'speculators_config.proposal_methods': 3 is not a list"),
    ("tiny-mla", "eagle", "rope_scaling", "yarn", "'rope_scaling': 'yarn' is not an object"),
    ("tiny-mla", "eagle", "rope_scaling", [4.0], "'rope_scaling': [4.0] is not an object"),
])
def test_a_field_of_the_wrong_json_type_is_named(name: str, style: str, key: str, value: object,
                                                 field: str) -> None:
    cfg = preset(name)
    d = to_speculators_dict(cfg) if style == "speculators" else to_eagle_dict(cfg)
    *parents, last = key.split(".")
    parent = d
    for p in parents:
        parent = parent[p]
    parent[last] = value
    with pytest.raises(EngineError, match=re.escape(f"config field {field}")):
        config_from_dict(d)


def test_transformers5_rope_parameters_spelling() -> None:
    d = to_eagle_dict(preset("llama3-8b"))
    rs = d.pop("rope_scaling")
    d["rope_parameters"] = {"rope_theta": d.pop("rope_theta"), **rs}
    cfg = config_from_dict(d)
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling == rs
