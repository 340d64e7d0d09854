"""Styles, the key map, weight readers/writers and the library load/save entry points."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine.ckpt.checks import expected_tensors, export_checks, load_drafter, run_checks
from engine.ckpt.config_styles import to_eagle_dict, to_speculators_dict
from engine.ckpt.drafter_dir import open_checkpoint
from engine.ckpt.drafter_save import save_drafter
from engine.ckpt.key_map import (
    LAYER_PREFIX,
    detect,
    from_eagle,
    from_speculators,
    to_eagle,
    to_speculators,
)
from engine.ckpt.safetensors_io import (
    SafetensorsWriter,
    open_weights,
    read_header,
    save_tensors,
    sha256_file,
)
from engine.errors import EngineError
from engine.model.draft import Eagle3Draft
from tests.drafters import random_state, tiny_config, write_drafter
from tests.engine_helpers import run_engine

# -- the key map --------------------------------------------------------------------------------


def test_key_map_is_the_layer_prefix_only_and_inverts() -> None:
    cfg = tiny_config(norm_before_fc=True, fc_norm=True)
    canonical = {k: k for k in expected_tensors(cfg)}
    spec = to_speculators(canonical)
    for s, c in spec.items():  # speculators name -> canonical name (the value)
        if c.startswith("midlayer."):
            assert s == "layers.0." + c[len("midlayer."):]
        else:
            assert s == c  # fc, norm, lm_head, d2t, t2d, embed_tokens, fc norms
    assert from_speculators(spec) == canonical
    assert to_eagle(canonical) == canonical == from_eagle(canonical)
    assert set(LAYER_PREFIX) == {"eagle", "speculators"}


def test_model_parameter_names_are_canonical() -> None:
    cfg = tiny_config(norm_before_fc=True, fc_norm=True)
    model_keys = set(Eagle3Draft(cfg).state_dict())
    assert model_keys == set(expected_tensors(cfg))


def test_detect_styles() -> None:
    e = to_eagle_dict(tiny_config())
    s = to_speculators_dict(tiny_config())
    assert detect(["fc.weight", "midlayer.mlp.up_proj.weight"], e, "x").format == "eagle"
    assert detect(["layers.0.mlp.up_proj.weight"], s, "x").format == "speculators"
    mixed = detect(["layers.0.mlp.up_proj.weight"], e, "x")
    assert (mixed.format, mixed.key_style, mixed.config_style) == ("mixed", "speculators", "eagle")
    with pytest.raises(EngineError, match="unknown style"):
        detect(["model.layers.0.mlp.up_proj.weight"], e, "x")
    with pytest.raises(EngineError, match="both"):
        detect(["midlayer.a", "layers.0.a"], e, "x")


# -- safetensors reader and writer --------------------------------------------------------------


def test_writer_output_loads_in_the_safetensors_library(tmp_path: Path) -> None:
    tensors = {"a": torch.randn(3, 5).to(torch.bfloat16), "b": torch.tensor([True, False]),
               "c": torch.arange(7, dtype=torch.int64), "empty": torch.zeros(0, 4),
               "h": torch.randn(2, 2).half()}
    save_tensors(tmp_path / "x.safetensors", tensors, {"note": "hi"})
    with safe_open(str(tmp_path / "x.safetensors"), "pt") as f:
        assert f.metadata()["note"] == "hi"
        for k, v in tensors.items():
            assert torch.equal(f.get_tensor(k), v)
    entries, meta = read_header(tmp_path / "x.safetensors")
    assert meta["format"] == "pt" and set(entries) == set(tensors)


def test_reader_matches_the_library_files(tmp_path: Path) -> None:
    t = {"w": torch.randn(4, 3), "i": torch.arange(5), "m": torch.rand(6) > 0.5}
    save_file(t, str(tmp_path / "model.safetensors"))
    ws = open_weights(tmp_path)
    for k, v in t.items():
        assert torch.equal(ws.load(k), v)
    assert torch.equal(ws.load_rows("w", torch.tensor([3, 1])), t["w"][[3, 1]])
    raw = b"".join(bytes(c) for c in ws.raw_chunks("w", chunk=5))
    assert raw == t["w"].numpy().tobytes()


def test_writer_refuses_out_of_order_and_short_writes(tmp_path: Path) -> None:
    w = SafetensorsWriter(tmp_path / "a.safetensors", [("x", "F32", (2,)), ("y", "F32", (1,))])
    with pytest.raises(RuntimeError, match="out of order"):
        w.write("y", b"\0" * 4)
    w.write("x", b"\0" * 8)
    with pytest.raises(RuntimeError, match="incomplete"):
        w.close()


def _corrupt_header(path: Path, header: dict) -> None:
    raw = json.dumps(header).encode()
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])


@pytest.mark.parametrize("damage,message", [
    ("truncate", "truncated"),
    ("append", "trailing bytes"),
    ("garbage", "not JSON"),
    ("tiny", "truncated"),
    ("overlap", "corrupt header"),
    ("dtype", "unsupported dtype"),
    ("size", "bytes stored for shape"),
])
def test_header_validation(tmp_path: Path, damage: str, message: str) -> None:
    p = tmp_path / "m.safetensors"
    save_file({"a": torch.zeros(4), "b": torch.ones(2, 2)}, str(p))
    entries, _ = read_header(p)
    hdr = {k: {"dtype": e.dtype, "shape": list(e.shape),
               "data_offsets": [e.offset - entries["a"].offset,
                                e.offset - entries["a"].offset + e.nbytes]}
           for k, e in entries.items()}
    if damage == "truncate":
        p.write_bytes(p.read_bytes()[:-3])
    elif damage == "append":
        p.write_bytes(p.read_bytes() + b"xx")
    elif damage == "garbage":
        p.write_bytes(struct.pack("<Q", 10) + b"{not json!" + b"\0" * 32)
    elif damage == "tiny":
        p.write_bytes(b"\x01\x02")
    elif damage == "overlap":
        hdr["b"]["data_offsets"] = [0, 16]
        hdr["a"]["data_offsets"] = [0, 16]
        _corrupt_header(p, hdr)
    elif damage == "dtype":
        hdr["a"]["dtype"] = "Q7"
        _corrupt_header(p, hdr)
    elif damage == "size":
        hdr["a"]["shape"] = [5]
        _corrupt_header(p, hdr)
    with pytest.raises(EngineError, match=message) as e:
        read_header(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_a_header_nested_too_deep_is_one_line_naming_the_file(tmp_path: Path) -> None:
    """The JSON parser's recursion limit is a corrupt header of that file, for every reader:
    inspect (a real subprocess) and the swap backend's read of a drafter folder."""
    from engine.capture.swap_backend import read_drafter
    write_drafter(tmp_path)
    p = tmp_path / "model.safetensors"
    served = {n: e.shape for n, e in read_header(p)[0].items()}
    raw = b"[" * 100_000 + b"]" * 100_000
    p.write_bytes(struct.pack("<Q", len(raw)) + raw)
    for read in (lambda: read_header(p), lambda: read_drafter(str(tmp_path), served)):
        with pytest.raises(EngineError, match="nested too deeply") as e:
            read()
        assert str(p) in str(e.value) and "\n" not in str(e.value)
    r = run_engine("inspect", str(tmp_path), check=False, timeout=120)
    assert r.returncode == 1 and r.stdout == "", r.stderr
    assert r.stderr.count("\n") == 1 and str(p) in r.stderr and "nested too deeply" in r.stderr


def test_sharded_index_errors(tmp_path: Path) -> None:
    write_drafter(tmp_path, layout="sharded")
    idx = tmp_path / "model.safetensors.index.json"
    index = json.loads(idx.read_text())
    ws = open_weights(tmp_path)
    assert len(ws.files) == 2 and "fc.weight" in ws.entries
    index["weight_map"]["fc.weight"] = "model-00009-of-00009.safetensors"
    idx.write_text(json.dumps(index))
    with pytest.raises(EngineError, match="does not exist"):
        open_weights(tmp_path)
    index["weight_map"]["fc.weight"] = "model-00002-of-00002.safetensors"
    index["weight_map"]["norm.weight"] = "model-00001-of-00002.safetensors"
    idx.write_text(json.dumps(index))
    with pytest.raises(EngineError, match="is not in shard"):
        open_weights(tmp_path)
    idx.write_text("{oops")
    with pytest.raises(EngineError, match="index.json: not valid JSON"):
        open_weights(tmp_path)


class Evil:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (print, ("pickle code ran",))


def test_bin_loads_with_weights_only_and_refuses_objects(tmp_path: Path,
                                                         capfd: pytest.CaptureFixture) -> None:
    state = write_drafter(tmp_path / "ok", layout="bin")
    ws = open_weights(tmp_path / "ok")
    assert ws.kind == "bin"
    assert torch.equal(ws.load("fc.weight"), state["fc.weight"])
    bad = tmp_path / "bad"
    bad.mkdir()
    torch.save({"fc.weight": torch.zeros(1), "x": Evil()}, bad / "pytorch_model.bin")
    with pytest.raises(EngineError, match="weights_only=True"):
        open_weights(bad)
    assert "pickle code ran" not in capfd.readouterr().out


def test_no_weights(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="no weights"):
        open_weights(tmp_path)


# -- open / check / load / save -----------------------------------------------------------------


@pytest.mark.parametrize("style", ["eagle", "speculators"])
@pytest.mark.parametrize("layout", ["single", "sharded", "bin"])
def test_load_drafter_any_style_into_the_model(tmp_path: Path, style: str, layout: str) -> None:
    state = write_drafter(tmp_path, style=style, layout=layout, embed=True)
    cfg, sd, det = load_drafter(tmp_path)
    assert det.format == style
    assert set(sd) == set(state)
    for k in state:
        assert torch.equal(sd[k], state[k])
    m = Eagle3Draft(cfg)
    m.load_state_dict(sd, strict=True)


def test_save_drafter_round_trip_and_atomicity(tmp_path: Path) -> None:
    cfg = tiny_config()
    state = random_state(cfg, embed=True)
    save_drafter(tmp_path / "s", cfg, state, "speculators", verifier="t/x",
                 provenance={"note": 1})
    conf = json.loads((tmp_path / "s" / "config.json").read_text())
    assert conf["norm_before_residual"] is False
    assert conf["speculators_config"]["verifier"]["name_or_path"] == "t/x"
    assert json.loads((tmp_path / "s" / "provenance.json").read_text())["note"] == 1
    cfg2, sd, det = load_drafter(tmp_path / "s")
    assert det.format == "speculators" and cfg2.verifier == "t/x"
    assert all(torch.equal(sd[k], state[k]) for k in state)
    save_drafter(tmp_path / "e", cfg, state, "eagle", include_embed=False)
    assert "embed_tokens.weight" not in load_drafter(tmp_path / "e")[1]
    with pytest.raises(EngineError, match="already exists"):
        save_drafter(tmp_path / "e", cfg, state, "eagle")
    bad = dict(state, **{"fc.weight": torch.zeros(3, 3)})
    with pytest.raises(EngineError, match="fc.weight"):
        save_drafter(tmp_path / "bad", cfg, bad, "eagle")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e", "s"]


def test_checks_pass_and_fail(tmp_path: Path) -> None:
    state = write_drafter(tmp_path / "good")
    checks = {c.name: c for c in run_checks(open_checkpoint(tmp_path / "good"))}
    assert all(c.ok for c in checks.values())
    assert "absent" in checks["embedding"].detail
    # t2d that disagrees with d2t
    state["t2d"] = state["t2d"].roll(1)
    write_drafter(tmp_path / "bad", state=state)
    checks = {c.name: c for c in run_checks(open_checkpoint(tmp_path / "bad"))}
    assert not checks["vocab_map"].ok and "t2d" in (checks["vocab_map"].error or "")


def test_fc_norm_tensors_are_recognised(tmp_path: Path) -> None:
    cfg = tiny_config(fc_norm=True)
    write_drafter(tmp_path, cfg=cfg, state=random_state(cfg))
    conf = json.loads((tmp_path / "config.json").read_text())
    del conf["fc_norm"]  # a public drafter whose config never mentions it
    (tmp_path / "config.json").write_text(json.dumps(conf))
    ck = open_checkpoint(tmp_path)
    assert ck.config.fc_norm and all(c.ok for c in run_checks(ck))
    assert export_checks(ck.config, list(ck.stored), "sglang")  # a warning, not an error


def test_export_checks_refuse_what_engines_mis_load() -> None:
    cfg = tiny_config()
    names = list(expected_tensors(cfg))
    with pytest.raises(EngineError, match="not a midlayer"):
        export_checks(cfg, names + ["layers.1.mlp.up_proj.weight"], "sglang")
    with pytest.raises(EngineError, match="d2t"):
        export_checks(cfg, [n for n in names if n != "d2t"], "vllm")
    with pytest.raises(EngineError, match="norm_before_residual"):
        export_checks(cfg.with_(norm_before_residual=True), names, "vllm")
    nbr = cfg.with_(norm_before_residual=True, verifier="t/x")
    assert export_checks(nbr, names, "speculators") == []
    with pytest.raises(EngineError, match="verifier"):
        export_checks(cfg, names, "speculators")


def test_sha256_helper(tmp_path: Path) -> None:
    import hashlib

    p = tmp_path / "f"
    p.write_bytes(b"abc" * 100001)  # not a whole number of windows
    assert sha256_file(p, window=8192) == hashlib.sha256(p.read_bytes()).hexdigest()


def test_target_embedding_goes_into_the_model_frozen(tmp_path: Path) -> None:
    from engine.ckpt.target_weights import load_target_embedding
    from tests.drafters import write_target_embedding

    cfg = tiny_config()
    emb = write_target_embedding(tmp_path / "target", cfg)
    m = Eagle3Draft(cfg)
    m.set_embedding(load_target_embedding(tmp_path / "target", cfg))
    assert torch.equal(m.embed_tokens.weight, emb.float())
    assert not m.embed_tokens.weight.requires_grad
    with pytest.raises(EngineError, match="model.embed_tokens.weight"):
        load_target_embedding(tmp_path / "target", tiny_config(hidden_size=32,
                                                               num_attention_heads=2,
                                                               num_key_value_heads=1))
