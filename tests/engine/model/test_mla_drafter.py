"""The MLA draft layer (engine/model/mla_layer.py) against its references: transformers'
DeepSeek-V3 attention block at step 0 (same weights, yarn with mscale, interleaved RoPE), and the
TTT extension without a mask against the dense-mask path, as
tests/engine/model/test_ttt_attention.py checks the Llama layer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.model.blocks import inv_freq, rope_cos_sin
from engine.model.draft import Eagle3Config, Eagle3Draft, preset, ttt_mask
from engine.model.mla_layer import MLAttention
from tests.ttt_grads import loss_and_grads

transformers_v3 = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")


def _cfg(q_lora: bool) -> Eagle3Config:
    cfg = preset("tiny-mla")
    return cfg if q_lora else cfg.with_(q_lora_rank=None)


def _reference(cfg: Eagle3Config, attn: MLAttention) -> tuple[nn.Module, nn.Module]:
    """transformers' DeepseekV3Attention over a 2H input with our weights (its o_proj, built for
    a hidden size of 2H, replaced by ours [H, nh*v])."""
    from transformers import DeepseekV3Config
    rs = dict(cfg.rope_scaling or {})
    hf = DeepseekV3Config(
        hidden_size=2 * cfg.hidden_size, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_attention_heads, q_lora_rank=cfg.q_lora_rank,
        kv_lora_rank=cfg.kv_lora_rank, qk_nope_head_dim=cfg.qk_nope_head_dim,
        qk_rope_head_dim=cfg.qk_rope_head_dim, v_head_dim=cfg.v_head_dim,
        max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps,
        rope_parameters={**rs, "rope_theta": cfg.rope_theta}, rope_interleave=True,
        attention_bias=False)
    hf._attn_implementation = "eager"
    ref = transformers_v3.DeepseekV3Attention(hf, layer_idx=0).double()
    ref.o_proj = nn.Linear(attn.nh * attn.vd, cfg.hidden_size, bias=False).double()
    for m in (ref.q_a_layernorm, ref.kv_a_layernorm):
        if m is not None:
            m.variance_epsilon = cfg.rms_norm_eps
    missing, unexpected = ref.load_state_dict(attn.state_dict(), strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    return ref, transformers_v3.DeepseekV3RotaryEmbedding(hf)


@pytest.mark.parametrize("q_lora", [True, False])
@pytest.mark.parametrize("dense", [False, True])
def test_step0_attention_equals_transformers_deepseek_v3(q_lora: bool, dense: bool) -> None:
    """Same weights, same 2H input, positions past yarn's original context (so its ramp,
    cos/sin mscale and the mscale_all_dim softmax factor all count): equal outputs."""
    cfg = _cfg(q_lora)
    torch.manual_seed(0)
    attn = MLAttention(cfg).double()
    with torch.no_grad():
        for name, p in attn.named_parameters():
            if "layernorm" in name:
                p.uniform_(0.5, 1.5)
    ref, rotary = _reference(cfg, attn)
    b, t, h = 2, 11, cfg.hidden_size
    x = torch.randn(b, t, 2 * h, dtype=torch.float64)
    pos = (torch.arange(t) + 300).expand(b, t)  # beyond original_max_position_embeddings 128
    freqs, mscale = inv_freq(cfg)
    cos, sin = rope_cos_sin(pos, freqs, mscale, torch.float64)
    mask = ttt_mask(t, 0, None, x.device) if dense else None
    got, (k, v) = attn(attn.embed_part(x[..., :h]), x[..., h:], cos, sin, [], mask)
    causal = torch.full((t, t), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    want, _ = ref(x, rotary(x, pos), causal)
    # float64 everywhere but the RoPE frequencies, which both sides keep in float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert k.shape == v.shape == (b, attn.nh, t, attn.qk)  # v padded to the q/k width
    assert ref.scaling != attn.qk ** -0.5  # yarn's mscale_all_dim counted


def test_step0_attention_float32_within_precision() -> None:
    cfg = _cfg(True)
    torch.manual_seed(3)
    attn = MLAttention(cfg)
    ref, rotary = _reference(cfg, attn)
    ref.float()
    x = torch.randn(1, 9, 2 * cfg.hidden_size)
    pos = torch.arange(9)[None] + 1000
    freqs, mscale = inv_freq(cfg)
    cos, sin = rope_cos_sin(pos, freqs, mscale, torch.float32)
    h = cfg.hidden_size
    got, _ = attn(attn.embed_part(x[..., :h]), x[..., h:], cos, sin, [], None)
    causal = torch.full((9, 9), float("-inf")).triu(1)[None, None]
    want, _ = ref(x, rotary(x, pos), causal)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _mla_draft(dtype: torch.dtype, q_lora: bool = True) -> Eagle3Draft:
    cfg = _cfg(q_lora).with_(vocab_size=80, draft_vocab_size=40)
    torch.manual_seed(4)
    m = Eagle3Draft(cfg).to(dtype)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
        m.embed_tokens.weight.normal_()
    return m


@pytest.mark.parametrize("q_lora", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_mla_ttt_split_equals_dense(dtype: torch.dtype, q_lora: bool) -> None:
    """K = 5 TTT steps with right padding: logits at real positions and every weight's gradient
    agree between the split attention (per-head K/V after decompression, the shared rope key)
    and the dense-mask reference."""
    tol = {torch.float64: 1e-10, torch.float32: 1e-5}[dtype]
    m = _mla_draft(dtype, q_lora)
    torch.manual_seed(5)
    b, t, k = 3, 21, 5
    aux = torch.randn(b, t, 3 * 64, dtype=dtype)
    ids = torch.randint(0, 80, (b, t))
    att = torch.ones(b, t, dtype=torch.long)
    att[1, 15:] = 0
    weights = [torch.randn(b, t, 40, dtype=dtype) for _ in range(k)]
    m.attn_impl = "split"
    got, g_got = loss_and_grads(m, aux, ids, att, k, weights)
    m.attn_impl = "dense"
    want, g_want = loss_and_grads(m, aux, ids, att, k, weights)
    from engine.model.draft import valid_positions
    for i in range(k):
        real = att.bool() & valid_positions(t, i)[None]
        torch.testing.assert_close(got[i][real], want[i][real], rtol=tol, atol=tol)
    assert "midlayer.self_attn.kv_b_proj.weight" in g_got and g_got.keys() == g_want.keys()
    for name, g in g_got.items():
        torch.testing.assert_close(g, g_want[name], rtol=tol, atol=tol * 10, msg=name)


def test_mla_greedy_chains_match_on_both_paths() -> None:
    m = _mla_draft(torch.float32)
    torch.manual_seed(6)
    aux, ids = torch.randn(2, 13, 3 * 64), torch.randint(0, 80, (2, 14))
    split_all, split_one = m.draft_greedy_all(aux, ids, 4), m.draft_greedy(aux, ids, 4)
    m.attn_impl = "dense"
    assert torch.equal(split_all, m.draft_greedy_all(aux, ids, 4))
    assert torch.equal(split_one, m.draft_greedy(aux, ids, 4))
    assert torch.equal(split_all[:, -1], split_one)


@pytest.mark.slow
def test_mla_ttt_step_compiles_and_matches_eager() -> None:
    """--compile with the MLA layer: dynamo captures its step (aot_eager: graph capture and
    autograd without code generation: 20 s on 2 busy cores); logits and gradients as eager."""
    import torch._dynamo
    torch._dynamo.reset()
    m = _mla_draft(torch.float32)
    aux, ids = torch.randn(2, 12, 3 * 64), torch.randint(0, 80, (2, 12))

    def run() -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
        m.zero_grad(set_to_none=True)
        lg = m.ttt_forward(aux, ids, 3)
        sum(x.square().mean() for x in lg).backward()  # type: ignore[union-attr]
        return [x.detach() for x in lg], {n: p.grad.clone() for n, p in m.named_parameters()
                                          if p.grad is not None}
    want, g_want = run()
    m.compile_step(backend="aot_eager", dynamic=False)
    got, g_got = run()
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert g_got.keys() == g_want.keys()
    for n, g in g_want.items():
        torch.testing.assert_close(g_got[n], g, rtol=1e-4, atol=1e-4, msg=n)
