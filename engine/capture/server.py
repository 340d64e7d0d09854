"""The vLLM server that captures a target's hidden states: its layer ids and its command line.

vLLM (0.18+) saves hidden states while serving with the speculative method
`extract_hidden_states` and the KV connector `ExampleHiddenStatesConnector` (vLLM docs: "Hidden
State Extraction"; docs/eagle3.md#the-hidden-states-connector):

    vllm serve TARGET --tensor-parallel-size N --no-enable-chunked-prefill
      --speculative-config '{"method": "extract_hidden_states", "num_speculative_tokens": 1,
                             "draft_model_config": {"hf_config":
                                 {"eagle_aux_hidden_state_layer_ids": [2, 30, 58, 61]}}}'
      --kv-transfer-config '{"kv_connector": "ExampleHiddenStatesConnector",
                             "kv_role": "kv_producer",
                             "kv_connector_extra_config": {"shared_storage_path": DIR}}'

Layer ids (vLLM convention): id k < N is the INPUT of decoder layer k; id N (num_hidden_layers) is
the last layer's output before the final norm. The server is asked for the distinct aux ids plus
N, ascending (`capture_layer_ids`); the client (engine/capture/vllm_client.py) picks the aux slots
and the final slot out of the file's [T, L, H] tensor by the same list and applies the final norm
itself.

MLA targets (`kv_lora_rank` in config.json: DeepSeek-V3 / Kimi-K2 style) are refused here: the
connector keeps the hidden states in a KV-cache group of its own, which vLLM cannot build beside an
MLA cache; `engine prepare --vllm-engine` (engine/capture/vllm_engine.py) captures them instead.
Standard library only: this runs where vLLM runs.
"""

from __future__ import annotations

import json
import os
from typing import Any

from engine.ckpt.target_config import read_config
from engine.ckpt.target_layout import vllm_text_only
from engine.errors import EngineError
from engine.model.config import default_aux_layer_ids

CONNECTOR = "ExampleHiddenStatesConnector"
DEFAULT_STORAGE = "/tmp/eagle3-hidden-states"  # capture-server --storage = the clients' default
METHOD = "extract_hidden_states"


def capture_layer_ids(aux_ids: list[int], num_layers: int) -> list[int]:
    """The ids the server captures: the distinct aux ids and num_layers, ascending."""
    return sorted(set(aux_ids) | {num_layers})


def slots(aux_ids: list[int], num_layers: int) -> tuple[list[int], int]:
    """(slot of each aux id, slot of the final pre-norm state) in the file's layer axis."""
    ids = capture_layer_ids(aux_ids, num_layers)
    return [ids.index(k) for k in aux_ids], ids.index(num_layers)


def target_config(target_dir: str) -> dict[str, Any]:
    """config.json (text_config unwrapped), read without torch: printing a command stays fast."""
    return read_config(target_dir, required=("num_hidden_layers",))


def default_layer_ids(num_layers: int) -> list[int]:
    """The engine's aux ids (engine/model/config.py `default_aux_layer_ids`: vLLM's
    2, N//2, N-3, distinct) plus N."""
    return capture_layer_ids(default_aux_layer_ids(num_layers), num_layers)


def refuse_mla(cfg: dict[str, Any], target_dir: str) -> None:
    if cfg.get("kv_lora_rank") is not None:
        raise EngineError(
            f"{target_dir}: an MLA target (kv_lora_rank {cfg['kv_lora_rank']} in config.json, "
            f"DeepSeek-V3 / Kimi-K2 style): vLLM's {CONNECTOR} does not support MLA attention; "
            "capture through vLLM's executor instead: engine prepare --target TARGET --data "
            "CONV --out DATA --vllm-engine --tp N (the engine starts vLLM in-process)")


def speculative_config(layer_ids: list[int]) -> dict[str, Any]:
    return {"method": METHOD, "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": layer_ids}}}


def kv_transfer_config(storage: str) -> dict[str, Any]:
    return {"kv_connector": CONNECTOR, "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": storage}}


def serve_argv(target_dir: str, layer_ids: list[int], tp: int = 1, port: int = 8000,
               host: str = "127.0.0.1", storage: str = DEFAULT_STORAGE,
               vllm: str = "vllm", served_name: str | None = None, dtype: str | None = None,
               extra: list[str] | None = None) -> list[str]:
    """The exact `vllm serve` argv (module docstring); `dtype` unless `extra` names one."""
    argv = [vllm, "serve", os.path.abspath(target_dir),
            "--tensor-parallel-size", str(tp), "--host", host, "--port", str(port),
            "--no-enable-chunked-prefill",
            "--speculative-config", json.dumps(speculative_config(layer_ids)),
            "--kv-transfer-config", json.dumps(kv_transfer_config(os.path.abspath(storage)))]
    if served_name:
        argv += ["--served-model-name", served_name]
    extra = list(extra or [])
    if dtype and not any(a == "--dtype" or a.startswith("--dtype=") for a in extra):
        argv += ["--dtype", dtype]
    if vllm_text_only(target_dir, extra)[0]:
        argv.append("--language-model-only")  # a multimodal wrapper: its text stack alone
    return argv + extra
