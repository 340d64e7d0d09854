"""The layer-by-layer reference check on Kimi's real checkpoint format: routed experts in int4,
compressed-tensors `pack-quantized` (engine/ckpt/int4_packed.py). The forward on the int4 files
equals the dequantised twin's; the unpacking agrees with a word packed by hand from the format's
description (and with compressed-tensors' own code when vLLM's Python has it); a scheme the engine
does not read is refused naming config.json's field."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.capture.layerwise_reference import LayerwiseReference
from engine.capture.reference_check import Reference, ReferenceCheck, text_stack_bytes
from engine.ckpt.int4_packed import dequantise, packed_scheme, unpack
from engine.errors import EngineError
from tests.kimi_int4 import KIMI_QUANT, build_int4_pair, dequant, pack, quantise

pytest_plugins = ("tests.demo_workspace", "tests.kimi_target")
IDS = [2, 3, 4, 7]


@pytest.fixture(scope="module")
def kimi_int4(kimi_pair: tuple[Path, Path],
              tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the Kimi-shaped wrapper with int4 pack-quantized experts, its dequantised plain twin):
    read-only."""
    return build_int4_pair(*kimi_pair, tmp_path_factory.mktemp("kimi-int4"))


@pytest.fixture(scope="module")
def tokens(kimi_pair: tuple[Path, Path]) -> list[int]:
    vocab = json.loads((kimi_pair[1] / "config.json").read_text())["vocab_size"]
    return torch.randint(0, vocab, (90,), generator=torch.Generator().manual_seed(5)).tolist()


def test_int4_experts_give_the_dequantised_twins_states(kimi_int4: tuple[Path, Path],
                                                       kimi_pair: tuple[Path, Path],
                                                       tokens: list[int]) -> None:
    """The int4 wrapper, one layer at a time, against its dequantised twin whole (transformers'
    from_pretrained) and one layer at a time: the same states at every captured id. The
    original float experts give other states (the quantisation is not a no-op)."""
    int4, twin = kimi_int4
    got = LayerwiseReference(str(int4), IDS).states(tokens)
    whole = Reference(str(twin), IDS).states(tokens)
    layered = LayerwiseReference(str(twin), IDS).states(tokens)
    diff = float((got - whole).abs().max())
    print(f"int4 layer by layer vs dequantised twin: max |diff| {diff:.2e} (whole), "
          f"{float((got - layered).abs().max()):.2e} (layer by layer)")
    assert diff <= 1e-6 and torch.equal(got, layered)
    original = Reference(str(kimi_pair[1]), IDS).states(tokens)
    assert float((got[:, 1:] - original[:, 1:]).abs().max()) > 1e-3
    check = ReferenceCheck(str(int4), IDS, torch.float32)  # auto: layers, dequantised
    assert check.mode == "layers" and "int4 (pack-quantized)" in check.why
    check("s0", tokens, whole)
    assert check.results[0]["worst"] < 1e-6


def test_the_memory_estimate_counts_dequantised_experts(kimi_int4: tuple[Path, Path]) -> None:
    """The int4 files are smaller on disk but the forward holds float32 experts: the estimate
    is the twin's, to the byte."""
    int4, twin = kimi_int4
    assert text_stack_bytes(str(int4)) == text_stack_bytes(str(twin))
    assert (int4 / "model.safetensors").stat().st_size < (twin / "model.safetensors").stat().st_size


def _word(nibbles: list[int]) -> int:
    """Eight 4-bit fields, the first in the lowest bits, read as a signed int32."""
    v = sum(n << (4 * i) for i, n in enumerate(nibbles))
    return v - (1 << 32) if v >= 1 << 31 else v


def test_unpack_reads_a_word_packed_by_hand() -> None:
    """The format from its description: q stored as q + 8, column 8j + i in bits 4i..4i+3 of
    word j. The top nibble here is >= 8, so the word is negative as an int32."""
    q = [-8, -1, 0, 7, 3, -5, 1, 2, 6, -3]  # 10 columns: the second word is padded
    words = [_word([x + 8 for x in q[:8]]), _word([x + 8 for x in q[8:]] + [0] * 6)]
    assert words[0] == -1_455_687_568  # 0xA93BF870: nibbles 0,7,8,15,11,3,9,10 from the low end
    packed = torch.tensor([words], dtype=torch.int32)
    assert unpack(packed, 10).tolist() == [q]
    scale = torch.tensor([[0.5]], dtype=torch.bfloat16)
    w = dequantise(torch.tensor([[words[0]]], dtype=torch.int32), scale, [1, 8], 8)
    assert w.dtype == torch.float32 and w.tolist() == [[x * 0.5 for x in q[:8]]]


def test_the_fixture_packing_round_trips() -> None:
    """The fixture's packer (a loop over Python ints) and the engine's unpack agree on random
    weights, and dequantise gives the fixture's dequant to the bit."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(6, 96, generator=g)
    q, scale = quantise(w)
    assert torch.equal(unpack(pack(q), 96), q)
    assert torch.equal(dequantise(pack(q), scale, [6, 96], 32), dequant(q, scale))


VLLM_PY = os.environ.get("EAGLE3_VLLM_PYTHON", "/work/main/.venv-vllm/bin/python")
CT_DEQUANT = """
import sys, torch
from safetensors.torch import load_file, save_file
from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
from compressed_tensors.quantization.lifecycle.forward import dequantize
sd = load_file(sys.argv[1])
shape = torch.Size(sd["weight_shape"].tolist())
q = unpack_from_int32(sd["weight_packed"], 4, shape)
save_file({"weight": dequantize(q, sd["weight_scale"]).float().contiguous()}, sys.argv[2])
"""


def test_dequantise_equals_compressed_tensors(tmp_path: Path) -> None:
    """compressed-tensors' own unpack and dequantize (in vLLM's Python, read-only) give our
    dequantised weight to the bit."""
    if not Path(VLLM_PY).exists():
        pytest.skip("no vLLM Python with compressed-tensors")
    probe = subprocess.run([VLLM_PY, "-c", "import compressed_tensors"], capture_output=True)
    if probe.returncode:
        pytest.skip("compressed-tensors is not installed in vLLM's Python")
    from safetensors.torch import load_file, save_file
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(2))
    q, scale = quantise(w)
    sd = {"weight_packed": pack(q), "weight_scale": scale, "weight_shape": torch.tensor([8, 64])}
    save_file(sd, str(tmp_path / "in.safetensors"))
    subprocess.run([VLLM_PY, "-c", CT_DEQUANT, str(tmp_path / "in.safetensors"),
                    str(tmp_path / "out.safetensors")], check=True, timeout=120)
    theirs = load_file(str(tmp_path / "out.safetensors"))["weight"]
    assert torch.equal(dequantise(sd["weight_packed"], scale, [8, 64], 32), theirs)


def _with_quant(src: Path, dst: Path, qc: dict, under_text: bool = False) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop("quantization_config", None)
    if under_text:
        cfg["text_config"]["quantization_config"] = qc
    else:
        cfg["quantization_config"] = qc
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _changed(path: str, value: object) -> dict:
    qc = json.loads(json.dumps(KIMI_QUANT))
    *parents, last = path.split(".")
    d = qc
    for p in parents:
        d = d[p]
    d[last] = value
    return qc


W = "config_groups.group_0.weights"


@pytest.mark.parametrize(("field", "value"), [
    (f"{W}.num_bits", 8), (f"{W}.symmetric", False), ("format", "float-quantized"),
    (f"{W}.type", "float"), (f"{W}.strategy", "channel"), (f"{W}.actorder", "group"),
    ("config_groups.group_0.input_activations", {"num_bits": 8, "type": "float"}),
    ("quant_method", "fp8"),
])
def test_an_unsupported_scheme_is_refused_naming_the_field(
        kimi_int4: tuple[Path, Path], tmp_path: Path, field: str, value: object) -> None:
    target = _with_quant(kimi_int4[0], tmp_path / "t", _changed(field, value))
    want = f"config.json: quantization_config.{field} is {value!r}"
    with pytest.raises(EngineError, match=re.escape(want)) as e:
        LayerwiseReference(str(target), IDS)
    assert "\n" not in str(e.value)
    with pytest.raises(EngineError, match=re.escape(want)):
        ReferenceCheck(str(target), IDS, torch.float32)  # auto sizes the target first


def test_the_scheme_is_read_under_text_config_too(kimi_int4: tuple[Path, Path],
                                                  tmp_path: Path) -> None:
    target = _with_quant(kimi_int4[0], tmp_path / "t", KIMI_QUANT, under_text=True)
    assert packed_scheme(str(target)) is not None
    bad = _with_quant(kimi_int4[0], tmp_path / "b", _changed(f"{W}.num_bits", 2),
                      under_text=True)
    with pytest.raises(EngineError, match=r"text_config\.quantization_config\.config_groups"
                                          r"\.group_0\.weights\.num_bits is 2"):
        packed_scheme(str(bad))


def test_packed_tensors_without_a_quantization_config_are_refused(
        kimi_int4: tuple[Path, Path], tmp_path: Path) -> None:
    """Refused when the check is set up, in every mode: transformers' from_pretrained (the
    `full` mode, which `auto` picks for a target it takes as unquantised) would skip the packed
    tensors and randomly initialise the experts, and the check would then blame vLLM."""
    target = tmp_path / "t"
    shutil.copytree(kimi_int4[0], target)
    cfg = json.loads((target / "config.json").read_text())
    cfg.pop("quantization_config")
    (target / "config.json").write_text(json.dumps(cfg))
    want = (re.escape(str(target / "model.safetensors")) + r": \S+experts\.0\.(gate|up|down)"
            r"_proj\.weight_packed is packed but " + re.escape(str(target / "config.json"))
            + " has no quantization_config")
    for build in (lambda: LayerwiseReference(str(target), IDS),
                  lambda: ReferenceCheck(str(target), IDS, torch.float32),
                  lambda: ReferenceCheck(str(target), IDS, torch.float32, mode="full")):
        with pytest.raises(EngineError, match=want) as e:
            build()
        assert "\n" not in str(e.value)


def _crafted(int4: Path, dst: Path, change: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    """A copy of the int4 target whose tensors `change` edits in place."""
    from safetensors.torch import load_file, save_file
    shutil.copytree(int4, dst)
    sd = load_file(str(dst / "model.safetensors"))
    change(sd)
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def _first(sd: dict[str, torch.Tensor], suffix: str) -> str:
    return sorted(n for n in sd if n.endswith(suffix))[0]


def _set(suffix: str, make: Callable[[torch.Tensor], torch.Tensor]
         ) -> Callable[[dict[str, torch.Tensor]], None]:
    def change(sd: dict[str, torch.Tensor]) -> None:
        name = _first(sd, suffix)
        sd[name] = make(sd[name])
    return change


@pytest.mark.parametrize(("suffix", "make", "says"), [
    (".weight_shape", lambda t: torch.tensor([*t.tolist(), 1]), r"I64 \[3\]"),
    (".weight_shape", lambda t: torch.tensor(int(t[0])), r"I64 \[\]"),
    (".weight_shape", lambda t: t.float() + 0.7, r"F32 \[2\]"),
    (".weight_packed", lambda t: t.to(torch.int64), r"I64 \[\d+, \d+\]"),
    (".weight_scale", lambda t: t.to(torch.int32), r"I32 \[\d+, \d+\]"),
], ids=["shape-3-values", "shape-0-d", "shape-float", "packed-int64", "scale-int32"])
def test_a_malformed_packed_tensor_is_refused_naming_file_and_tensor(
        kimi_int4: tuple[Path, Path], tmp_path: Path, suffix: str,
        make: Callable[[torch.Tensor], torch.Tensor], says: str) -> None:
    """Checked from the headers when the check is set up, before any capture runs."""
    target = _crafted(kimi_int4[0], tmp_path / "t", _set(suffix, make))
    want = (re.escape(str(target / "model.safetensors")) + r": language_model\.model\.layers\.\d+"
            r"\.mlp\.experts\.\d+\.\w+_proj" + re.escape(suffix) + " is " + says + "; ")
    for build in (lambda: ReferenceCheck(str(target), IDS, torch.float32),
                  lambda: LayerwiseReference(str(target), IDS)):
        with pytest.raises(EngineError, match=want) as e:
            build()
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("scale", [float("nan"), 3e38], ids=["nan", "overflow"])
def test_a_scale_whose_weight_is_not_finite_fails_the_check_by_name(
        kimi_int4: tuple[Path, Path], tokens: list[int], tmp_path: Path, scale: float) -> None:
    """A NaN scale, or one whose product with a nibble overflows bfloat16, in every expert:
    the check fails naming the file and the scale, never passes on a NaN reference."""
    def change(sd: dict[str, torch.Tensor]) -> None:
        for n in sd:
            if n.endswith(".weight_scale"):
                sd[n][0, 0] = scale
    target = _crafted(kimi_int4[0], tmp_path / "t", change)
    check = ReferenceCheck(str(target), IDS, torch.float32)
    captured = Reference(str(kimi_int4[1]), IDS).states(tokens)
    want = (re.escape(str(target / "model.safetensors")) + r": language_model\.model\.layers\.\d+"
            r"\.mlp\.experts\.\d+\.\w+_proj\.weight_scale: row 0, group 0 is "
            + ("nan" if scale != scale else r"3\.\d+e\+38") + ": the dequantised weight is not "
            "finite")
    with pytest.raises(EngineError, match=want):
        check("s0", tokens, captured)
    assert check.results == []
