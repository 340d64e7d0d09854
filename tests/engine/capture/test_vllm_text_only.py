"""Where the engine starts vLLM for text only (prepare --vllm-engine, capture-server, eval
--vllm-engine), a multimodal wrapper's text stack is built alone: `language_model_only` is passed
unless the user named it, and the log says so (engine/ckpt/target_layout.py `vllm_text_only`).
Checked here on the engine arguments each path would hand vLLM, without vLLM; the real-vLLM case
is tests/engine/capture/test_vllm_capture_engine.py's Kimi wrapper capture."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from engine.capture.server import serve_argv
from engine.capture.vllm_engine import engine_kwargs
from engine.training.vllm_eval import llm_kwargs
from tests.engine_helpers import run_engine

pytest_plugins = ("tests.demo_workspace", "tests.kimi_target")


@pytest.fixture(scope="module")
def llava_like(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo target (GQA, no MLA: the capture server takes it) as a transformers >= 4.52
    wrapper stores one: `model.language_model.*` + `lm_head.*`, the config under
    `text_config`."""
    from safetensors.torch import load_file, save_file
    src, out = demo_dir / "target", tmp_path_factory.mktemp("llava") / "t"
    shutil.copytree(src, out)
    sd = load_file(str(src / "model.safetensors"))
    save_file({(k if k.startswith("lm_head.") else "model.language_model."
                + k.removeprefix("model.")): v for k, v in sd.items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    text = json.loads((src / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
        "text_config": text, "vision_config": {"model_type": "clip_vision_model"}}))
    return out


def kwargs(target: Path, extra: dict[str, object]) -> dict[str, object]:
    cfg = {"max_position_embeddings": 512}
    return engine_kwargs(str(target), cfg, torch.float32, 1, 0.5, 128, 1024, extra)


def test_the_capture_engine_builds_a_wrappers_text_stack_alone(
        kimi_pair: tuple[Path, Path]) -> None:
    wrapped, plain = kimi_pair
    assert kwargs(wrapped, {})["language_model_only"] is True
    assert "language_model_only" not in kwargs(plain, {})
    assert kwargs(wrapped, {"language_model_only": False})["language_model_only"] is False


def test_eval_through_vllm_builds_a_wrappers_text_stack_alone(
        kimi_pair: tuple[Path, Path]) -> None:
    wrapped, plain = kimi_pair
    assert llm_kwargs("d", str(wrapped), 3, 1, 64)["language_model_only"] is True
    assert "language_model_only" not in llm_kwargs("d", str(plain), 3, 1, 64)


def test_the_capture_server_serves_a_wrappers_text_stack_alone(llava_like: Path,
                                                               demo_dir: Path) -> None:
    assert "--language-model-only" in serve_argv(str(llava_like), [2, 3, 4, 7])
    assert "--language-model-only" not in serve_argv(str(demo_dir / "target"), [2, 3, 4, 7])
    mine = serve_argv(str(llava_like), [2, 3, 4, 7], extra=["--no-language-model-only"])
    assert "--language-model-only" not in mine and mine[-1] == "--no-language-model-only"
    p = run_engine("capture-server", "--target", str(llava_like), "--print", "--json")
    assert "--language-model-only" in json.loads(p.stdout)["argv"]
    assert "LlavaForConditionalGeneration, a multimodal wrapper" in p.stderr
    assert "language_model_only=true" in p.stderr
