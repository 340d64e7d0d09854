"""The target model: its tokenizer, a forward pass capturing the drafter's inputs, its heads.

Two ways in:
- `Target.load(dir)` loads the whole transformers model (prepare, `train --online`, eval, demo):
  `features()` runs the decoder stack once and returns the three aux hidden states (the INPUTS of
  decoder layers 2, N//2, N-3 by default -- vLLM's convention, captured with forward
  pre-hooks, so no full `output_hidden_states` tuple is kept) and the final-norm hidden state (the
  lm_head input). The vocabulary logits are not computed here: the trainer recomputes them from the
  final hidden state with the target's lm_head. `device_map="auto"` spreads a target too big for
  one GPU over the process's GPUs (accelerate); the captured states are gathered on the last one.
- `load_embedding(dir)` (engine/ckpt/target_weights.py) reads only the embedding, and its
  `TargetHead` only the lm_head rows a run needs (offline training never needs the decoder layers of
  a 1T-parameter target); `engine/ckpt/final_norm.py` reads only the final norm: it turns a captured
  last-layer output (vLLM id N) into the lm_head input.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from engine.ckpt.target_config import read_config
from engine.ckpt.target_layout import resolve_layout
from engine.errors import EngineError
from engine.model.config import default_aux_layer_ids


def default_aux_ids(num_layers: int) -> list[int]:
    """The aux ids captured and trained with (vLLM convention, id k = input of decoder layer
    k): vLLM's 2, N//2, N-3, or the nearest distinct layers where those meet
    (engine/model/config.py `default_aux_layer_ids`)."""
    return default_aux_layer_ids(num_layers)


def pick_device(device: str | None = None) -> torch.device:
    """`device` if given, else cuda:LOCAL_RANK when CUDA is there, else CPU."""
    if device:
        dev = torch.device(device)
        if dev.type != "cuda" or dev.index is not None:
            return dev
        # a bare "cuda": this rank's GPU (torch.cuda.set_device and device maps need an index)
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def load_tokenizer(target_dir: str) -> Any:
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(target_dir)
    except (OSError, ValueError) as e:
        raise EngineError(f"{target_dir}: cannot load the tokenizer ({str(e).splitlines()[0]})"
                          ) from None


def accelerate_available() -> bool:
    import importlib.util
    return importlib.util.find_spec("accelerate") is not None


def local_gpus() -> list[int]:
    """The GPU indices this process may use: all visible ones, or under torchrun with several
    local ranks, this rank's equal share (8 GPUs, 2 ranks: rank 0 gets 0-3, rank 1 gets 4-7)."""
    n = torch.cuda.device_count()
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if ranks <= 1:
        return list(range(n))
    per = n // ranks
    if per == 0:
        raise EngineError(f"--device-map auto: {ranks} processes per node share {n} GPU(s); "
                          "start at most one process per GPU")
    return list(range(local * per, (local + 1) * per))


def load_placement(dev: torch.device, device_map: str | None) -> dict[str, Any]:
    """from_pretrained keyword arguments that put the weights where they belong while loading
    (no full CPU copy of a large target first). transformers needs accelerate for any
    device_map; without it a single-device load goes through the CPU."""
    if device_map == "auto" and dev.type == "cuda":
        if not accelerate_available():
            raise EngineError("--device-map auto needs the accelerate package "
                              "(pip install accelerate)")
        gpus = local_gpus()
        if len(gpus) == torch.cuda.device_count():
            return {"device_map": "auto"}
        # this rank's GPUs only; 10% of the free memory left for activations
        return {"device_map": "auto",
                "max_memory": {i: int(torch.cuda.mem_get_info(i)[0] * 0.9) for i in gpus}}
    if device_map == "auto" and accelerate_available():
        return {"device_map": "auto"}  # no GPU: accelerate maps every module to the CPU
    if dev.type == "cuda" and accelerate_available():
        return {"device_map": str(dev)}
    return {}


def text_stack_kwargs(target_dir: str) -> dict[str, Any]:
    """from_pretrained keyword arguments that load a multimodal wrapper's text stack alone as a
    causal LM (engine/ckpt/target_layout.py): its `text_config` as the config, its stored names
    mapped to the causal LM's; the vision tower's tensors match no parameter and are never
    read. Nothing for a plain causal LM."""
    layout = resolve_layout(target_dir)
    if layout.wrapper is None:
        return {}
    from transformers import AutoConfig
    text = dict(layout.text_config)
    try:
        config = AutoConfig.for_model(text.pop("model_type"), **text)
    except (KeyError, ValueError) as e:
        raise EngineError(f"{target_dir}/config.json: text_config of {layout.wrapper}: "
                          f"{str(e).splitlines()[0]}") from None
    return {"config": config, "key_mapping": layout.key_mapping()}


@dataclass
class Target:
    """A loaded target: tokenizer, transformers causal LM (eval mode), capture settings."""

    path: str
    tokenizer: Any
    model: Any
    aux_layer_ids: list[int]
    device: torch.device

    @classmethod
    def load(cls, target_dir: str, device: str | None = None, dtype: torch.dtype | None = None,
             aux_layer_ids: list[int] | None = None, tokenizer: bool = True,
             device_map: str | None = None) -> Target:
        """Load the target on one device, or with `device_map="auto"` spread over this process's
        GPUs (all visible ones; under torchrun, this local rank's share of them)."""
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()  # our own progress events only
        cfg = read_config(target_dir)
        dev = pick_device(device)
        if device_map not in (None, "auto"):
            raise EngineError(f"--device-map {device_map!r}: only 'auto' is supported")
        if device_map == "auto" and not torch.cuda.is_available():
            dev = torch.device("cpu")  # nothing to shard over: everything on the CPU
        if dtype is None:  # CPU: float32 (bf16 matmuls are slow there); GPU: the stored dtype
            stored = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
            dtype = torch.float32 if dev.type == "cpu" else getattr(torch, stored, torch.bfloat16)
        kwargs = load_placement(dev, device_map)
        kwargs.update(text_stack_kwargs(target_dir))
        try:
            model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype, **kwargs)
        except (OSError, ValueError, KeyError) as e:
            raise EngineError(f"{target_dir}: cannot load the target model "
                              f"({str(e).splitlines()[0]})") from None
        if "device_map" not in kwargs:  # dispatched models must not be moved as a whole
            cast(nn.Module, model).to(dev)  # (transformers' wrapper of .to is mistyped)
        model.eval().requires_grad_(False)
        n = cfg["num_hidden_layers"]
        ids = list(aux_layer_ids) if aux_layer_ids is not None else default_aux_ids(n)
        if len(ids) != 3 or not all(0 <= k <= n for k in ids):
            raise EngineError(f"aux layer ids {ids} must be 3 ids in 0..{n} "
                              f"(the target has {n} layers)")
        tok = load_tokenizer(target_dir) if tokenizer else None
        # where input ids must go
        first = next(model.get_input_embeddings().parameters()).device
        return cls(path=target_dir, tokenizer=tok, model=model, aux_layer_ids=ids, device=first)

    @property
    def device_map(self) -> dict[str, str]:
        """module -> device as loaded ({"": device} when the whole model sits on one)."""
        hf = getattr(self.model, "hf_device_map", None)
        return {k: str(v) for k, v in hf.items()} if hf else {"": str(self.device)}

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def _decoder(self) -> Any:
        base = self.model.base_model
        if not hasattr(base, "layers") or not hasattr(base, "norm"):
            raise EngineError(f"{self.path}: unsupported architecture "
                              f"{type(self.model).__name__} (no decoder .layers/.norm)")
        return base

    @torch.no_grad()
    def features(self, input_ids: Tensor, attention_mask: Tensor | None = None
                 ) -> tuple[Tensor, Tensor]:
        """input_ids [B,T] -> (aux [B,T,3Ht] low/mid/high, hidden [B,T,Ht] after the final norm)."""
        base = self._decoder()
        captured: dict[int, Tensor] = {}

        def grab(k: int) -> Any:
            def hook(_mod: Any, args: tuple, kwargs: dict) -> None:
                captured[k] = args[0] if args else kwargs["hidden_states"]
            return hook

        handles = []
        for k in sorted(set(self.aux_layer_ids)):
            mod = base.layers[k] if k < self.num_layers else base.norm  # id N: last layer's output
            handles.append(mod.register_forward_pre_hook(grab(k), with_kwargs=True))
        try:
            out = base(input_ids=input_ids.to(self.device),
                       attention_mask=None if attention_mask is None else
                       attention_mask.to(self.device), use_cache=False)
        finally:
            for h in handles:
                h.remove()
        last = out.last_hidden_state
        # with a device map the layers (and so the captured inputs) sit on several GPUs
        aux = torch.cat([captured[k].to(last.device) for k in self.aux_layer_ids], dim=-1)
        return aux, last  # [B,T,3Ht], [B,T,Ht]

    def lm_head_weight(self) -> Tensor:
        return self.model.get_output_embeddings().weight  # [V,Ht]

    def embed_weight(self) -> Tensor:
        return self.model.get_input_embeddings().weight  # [V,Ht]


# -- greedy chat replies (demo data, the regen test server) ---------------------------------------

@torch.no_grad()
def greedy_replies(target: Target, chats: list[list[dict[str, str]]], max_new_tokens: int,
                   batch_size: int = 64) -> list[str]:
    """The target's greedy reply to each chat (rendered with the generation prompt), batched."""
    from engine.data.chat import prompt_ids
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    eos = tok.convert_tokens_to_ids(tok.eos_token) if tok.eos_token else None
    prompts = [prompt_ids(tok, c) for c in chats]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # less padding
    out: list[str] = [""] * len(prompts)
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        width = max(len(prompts[i]) for i in idx)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        att = torch.zeros((len(idx), width), dtype=torch.long)
        for r, i in enumerate(idx):  # left padding: every prompt ends at the same column
            ids[r, width - len(prompts[i]):] = torch.tensor(prompts[i])
            att[r, width - len(prompts[i]):] = 1
        gen = target.model.generate(input_ids=ids.to(target.device),
                                    attention_mask=att.to(target.device),
                                    max_new_tokens=max_new_tokens, do_sample=False,
                                    eos_token_id=eos, pad_token_id=pad)
        for r, i in enumerate(idx):
            new = gen[r, width:].tolist()
            if eos is not None and eos in new:
                new = new[:new.index(eos)]
            out[i] = tok.decode(new, skip_special_tokens=True)
    return out
