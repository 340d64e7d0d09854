"""`engine eval --vllm-engine`: the offline acceptance estimate through vLLM's own engine.

The target runs in vLLM (in this process: `vllm.LLM`, with TP workers of its own for `--tp`),
the drafter as its speculative config (`{"method": "eagle3", "model": DRAFT,
"num_speculative_tokens": K}`: a vLLM-loadable export), on the held-out prompts `engine eval`
uses (each sample before its first assistant token), greedy, up to `--max-new-tokens` or EOS.
Acceptance is vLLM's own counters after the run (`LLM.get_metrics`: drafts, draft tokens,
accepted tokens, accepted per position), so the figures are what a server would measure on the
same prompts.

When to use which: plain `engine eval` replays speculative decoding in transformers (any
drafter style, no vLLM needed, but the target must fit in transformers on this machine); this
one needs vLLM and a vLLM-loadable drafter, and holds any target vLLM can serve (a 1T int4 MoE
across a node's GPUs), counting exactly as vLLM counts.
"""

from __future__ import annotations

from typing import Any

from engine.ckpt.target_layout import LANGUAGE_MODEL_ONLY, vllm_text_only
from engine.events import Emitter
from engine.training.evaluate import prompts_from

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def figures(metrics: list[Any], k: int) -> dict[str, Any]:
    """vLLM's spec-decode counters (LLM.get_metrics) as acceptance figures (pure)."""
    total: dict[str, float] = {}
    per_pos = [0.0] * k
    for m in metrics:
        if m.name == PER_POSITION:
            for i, v in enumerate(getattr(m, "values", [])[:k]):
                per_pos[i] += float(v)
        elif m.name in (DRAFTS, DRAFT_TOKENS, ACCEPTED):
            total[m.name] = total.get(m.name, 0.0) + float(getattr(m, "value", 0))
    drafts = total.get(DRAFTS, 0.0)
    accepted = total.get(ACCEPTED, 0.0)
    return {"acceptance_length": 1 + accepted / drafts if drafts else None,
            "per_position": [p / drafts for p in per_pos] if drafts else [],
            "drafts": int(drafts), "draft_tokens": int(total.get(DRAFT_TOKENS, 0.0)),
            "accepted": int(accepted)}


def llm_kwargs(draft: str, target: str, k: int, tp: int, model_len: int) -> dict[str, Any]:
    """vLLM's LLM(...) arguments: the target with the drafter as its speculative config; a
    multimodal wrapper's text stack alone (engine/ckpt/target_layout.py `vllm_text_only`)."""
    return {"model": target, "tensor_parallel_size": tp, "enforce_eager": True, "seed": 0,
            "max_model_len": model_len, "disable_log_stats": False,
            "speculative_config": {"method": "eagle3", "model": draft,
                                   "num_speculative_tokens": k},
            **vllm_text_only(target, ())[0]}


def evaluate_vllm(draft: str, target: str, data: str, *, k: int = 3, max_samples: int = 64,
                  max_new_tokens: int = 64, tp: int = 1, ev: Emitter | None = None
                  ) -> dict[str, Any]:
    """The held-out prompts through vLLM with the drafter; vLLM's acceptance figures."""
    import time

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = prompts_from(data, max_samples)
    t0 = time.monotonic()
    kwargs = llm_kwargs(draft, target, k, tp,
                        max(len(p) for p in prompts) + max_new_tokens + k + 1)
    if ev is not None:
        ev.log(f"vLLM: {target} with drafter {draft} (k={k}), {len(prompts)} prompts")
        if LANGUAGE_MODEL_ONLY in kwargs:
            ev.log(vllm_text_only(target, ())[1])
    llm = LLM(**kwargs)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=max_new_tokens),
                        use_tqdm=False)
    res = figures(llm.get_metrics(), k)
    res.update({"samples": len(prompts), "steps": k, "engine": "vllm",
                "generated_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
                "seconds": round(time.monotonic() - t0, 2)})
    if res["acceptance_length"] is None:
        from engine.errors import EngineError
        raise EngineError(f"vLLM drafted nothing with {draft}: is it a vLLM-loadable export "
                          "(engine convert --to vllm)?")
    return res
