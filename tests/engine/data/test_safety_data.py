"""What a data directory, a checkpoint or a full disk can make `train`, `vocab build` and
`inspect` do: one worded line naming the file and a non-zero exit, never a NaN drafter published
as a success. Real crafted files, `python -m engine` in a subprocess, on tests/tiny_llama.py's
tiny target and prepared data."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine.demo.target import chats
from tests.engine_helpers import run_engine

pytest_plugins = ("tests.tiny_llama",)

TRAIN = ["--batch-tokens", "256", "--draft-vocab-size", "64", "--holdout", "0",
         "--ttt-steps", "2", "--lr", "3e-3"]


def train(target: Path, data: Path, out: Path, *extra: str, check: bool = False,
          **kw: Any) -> Any:
    return run_engine("train", "--target", str(target), "--data", str(data), "--out", str(out),
                      *TRAIN, *extra, check=check, **kw)


def last_line(p: Any) -> str:
    return str(p.stderr.strip().splitlines()[-1])


def copy_data(prepared: Any, dst: Path) -> Path:
    shutil.copytree(prepared[0], dst)
    return dst


def rewrite_shard(path: Path, **changes: torch.Tensor) -> None:
    """Write a shard again with some tensors replaced (its metadata kept)."""
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    tensors.update(changes)
    save_file(tensors, str(path), metadata=meta)


def shards(data: Path) -> list[Path]:
    return sorted(data.glob("shard_*.safetensors"))


# -- defect 4: a diverged run is a failure, and its weights are never exported -----------------

def test_nan_features_stop_the_run_and_export_nothing(tiny_target: Path,
                                                      prepared: Any, tmp_path: Path) -> None:
    data = copy_data(prepared, tmp_path / "data")
    for path in shards(data):
        with safe_open(str(path), "pt") as f:
            aux = f.get_tensor("aux_hidden_states")
        rewrite_shard(path, aux_hidden_states=torch.full_like(aux, float("nan")))
    run = tmp_path / "run"
    p = train(tiny_target, data, run, "--max-steps", "4", "--save-every", "1")
    assert p.returncode == 1, p.stderr[-2000:]
    line = last_line(p)
    assert line.startswith("error: step 1: the loss is not finite (nan)"), line
    assert "shard_00000.safetensors sample " in line or "shard_00001.safetensors sample " in line
    assert not (run / "final").exists() and not (run / "best").exists()
    assert not (run / "checkpoints").exists()
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "failed" and info["error"].startswith("EngineError: step 1:")


def test_inspect_fails_a_drafter_with_nan_weights(tmp_path: Path) -> None:
    from tests.drafters import random_state, tiny_config, write_drafter
    cfg = tiny_config()
    state = random_state(cfg)
    state["midlayer.mlp.up_proj.weight"][3, :5] = float("nan")
    state["norm.weight"][0] = float("inf")
    d = tmp_path / "nan-drafter"
    write_drafter(d, cfg, state=state)
    p = run_engine("inspect", str(d), "--json", check=False)
    assert p.returncode == 1, p.stdout[-2000:]
    checks = {c["name"]: c for c in json.loads(p.stdout)["checks"]}
    assert not checks["finite"]["ok"]
    assert checks["finite"]["detail"] == (
        f"midlayer.mlp.up_proj.weight: 5 of {cfg.intermediate_size * cfg.hidden_size} values "
        "are NaN or inf")
    p = run_engine("convert", str(d), str(tmp_path / "out"), "--to", "vllm", check=False)
    assert p.returncode == 1 and last_line(p) == (
        f"error: {d / 'model.safetensors'}: tensor 'midlayer.mlp.up_proj.weight' holds 5 "
        "non-finite values (NaN or inf)")
    assert not (tmp_path / "out").exists()
    write_drafter(d, cfg, state=random_state(cfg))  # the same drafter, finite
    p = run_engine("inspect", str(d), "--json")
    assert {c["name"]: c["ok"] for c in json.loads(p.stdout)["checks"]}["finite"]


# -- defect 5: --resume on changed data is refused by name, unless overridden -----------------

@pytest.mark.slow
def test_resume_refuses_changed_data(tiny_target: Path, prepared: Any, tmp_path: Path) -> None:
    data = copy_data(prepared, tmp_path / "data")
    run = tmp_path / "run"
    steps = ["--max-steps", "8", "--save-every", "2", "--keep", "4"]
    train(tiny_target, data, run, *steps, check=True)
    # as if killed after step 6: `latest` names it, the later checkpoint is gone
    shutil.rmtree(run / "checkpoints" / "step_000008")
    (run / "checkpoints" / "latest").write_text("step_000006\n")
    # the same --data path now holds other data: other conversations, prepared the same way
    src = tmp_path / "other.jsonl"
    src.write_text("".join(json.dumps({"conversations": c}) + "\n" for c in chats(8, 11)))
    run_engine("prepare", "--target", str(tiny_target), "--data", str(src), "--out",
               str(tmp_path / "other"), "--max-len", "64", "--batch-tokens", "200")
    shutil.rmtree(data)
    shutil.copytree(tmp_path / "other", data)
    more = [*steps, "--resume"]
    p = train(tiny_target, data, run, *more)
    assert p.returncode == 1, p.stderr[-2000:]
    line = last_line(p)
    assert line.startswith(f"error: --resume: the data ({data}): sha256 "), line
    assert line.endswith(f"changed since {run / 'checkpoints' / 'step_000006'} (the run would mix "
                         "them); pass --resume-despite-changed-data to continue anyway, or choose "
                         "a new --out"), line
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000006"
    help_text = run_engine("train", "--help").stdout
    assert "--resume-despite-changed-data" in help_text
    p = train(tiny_target, data, run, *more, "--resume-despite-changed-data", check=True)
    assert "--resume-despite-changed-data: continuing" in p.stderr
    assert json.loads((run / "run.json").read_text())["step"] == 8


# -- defect 7: sizes a file states are checked before anything of that size is allocated -------

def limited_memory(gib: int = 6) -> Any:
    """preexec_fn: cap the child's address space, so a 16 GB allocation fails fast instead of
    taking the shared machine's memory (the old behaviour this test guards against)."""
    import resource

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (gib << 30, gib << 30))
    return cap


def test_vocab_build_checks_a_manifest_vocab_size_first(prepared: Any, tmp_path: Path) -> None:
    data = copy_data(prepared, tmp_path / "data")
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["target"]["vocab_size"] = 2_000_000_000
    (data / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "vocab.safetensors"
    p = run_engine("vocab", "build", "--data", str(data), "--draft-vocab-size", "64", "--out",
                   str(out), check=False, preexec_fn=limited_memory())
    assert p.returncode == 1, p.stderr[-2000:]
    assert last_line(p) == (
        f"error: {data / 'manifest.json'}: field 'target.vocab_size': 2000000000 is above the "
        "largest vocab size the engine accepts (16777216)")
    assert not out.exists()
    p = run_engine("vocab", "build", "--data", str(data), "--draft-vocab-size", "64", "--out",
                   str(out), "--vocab-size", str(1 << 40), check=False,
                   preexec_fn=limited_memory())
    assert p.returncode == 1 and last_line(p) == (
        f"error: --vocab-size: {1 << 40} is above the largest vocab size the engine accepts "
        "(16777216)")


# -- defects 8 and 9: a data directory is checked when it is opened, and every lie is named -----

def _tensor(data: Path, key: str) -> torch.Tensor:
    with safe_open(str(shards(data)[0]), "pt") as f:
        return f.get_tensor(key)


def _manifest(data: Path, change: Any) -> None:
    m = json.loads((data / "manifest.json").read_text())
    change(m)
    (data / "manifest.json").write_text(json.dumps(m))


def _set(data: Path, key: str, sample: int, delta: int, value: int) -> None:
    """Set token `delta` of `sample` in tensor `key` of the first shard to `value`."""
    off = _tensor(data, "offsets")
    t = _tensor(data, key).clone()
    t[int(off[sample]) + delta] = value
    rewrite_shard(shards(data)[0], **{key: t})


def _offsets_back(data: Path) -> str:
    off = _tensor(data, "offsets").clone()
    start = int(off[3])
    off[4] = start - 1
    rewrite_shard(shards(data)[0], offsets=off)
    return f"tensor 'offsets': sample 3 ends at {start - 1}, not after its start {start}"


def _truncate(data: Path) -> str:
    path = shards(data)[0]
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return "not a readable safetensors file ("


CRAFTS: dict[str, Any] = {  # name -> (craft(data) -> expected text, file the error names)
    "offsets run backwards": (_offsets_back, "shard"),
    "a shard listed twice": (lambda d: _manifest(d, lambda m: m["shards"].append(
        m["shards"][0])) or "field 'shards[1].file': 'shard_00000.safetensors' is listed twice",
        "manifest"),
    "samples disagree": (lambda d: _manifest(d, lambda m: m.update(samples=11)) or
                         "field 'samples' is 11 but its shards hold 8", "manifest"),
    "a shard's samples disagree": (lambda d: _manifest(d, lambda m: m["shards"][0].update(
        samples=7)) or "field 'shards[0].samples' is 7 but shard_00000.safetensors holds 8",
        "manifest"),
    "a shard outside the directory": (lambda d: _manifest(d, lambda m: m["shards"][0].update(
        file=f"../{d.name}/shard_00000.safetensors")) or "field 'shards[0].file': "
        f"'../{d.name}/shard_00000.safetensors' is not a file name in the data directory",
        "manifest"),
    "mask value 2": (lambda d: _set(d, "loss_mask", 3, 0, 2) or
                     "tensor 'loss_mask': sample 3 holds 2 (values must be 0 or 1)", "shard"),
    "float ids": (lambda d: rewrite_shard(shards(d)[0], input_ids=_tensor(d, "input_ids").float())
                  or "tensor 'input_ids' is float32, expected integers", "shard"),
    "an id past the vocab": (lambda d: _set(d, "input_ids", 5, 1, 512) or
                             "tensor 'input_ids': sample 5 holds token id 512, outside the "
                             "target vocab [0, 512)", "shard"),
    "an argmax past the vocab": (lambda d: _set(d, "target_argmax", 2, 0, 70000) or
                                 "tensor 'target_argmax': sample 2 holds token id 70000, outside "
                                 "the target vocab [0, 512)", "shard"),
    "a truncated shard": (_truncate, "shard"),
    "shards are strings": (lambda d: _manifest(d, lambda m: m.update(
        shards=["shard_00000.safetensors"])) or "field 'shards[0]': must be an object with a "
        "'file' name", "manifest"),
    "target is a list": (lambda d: _manifest(d, lambda m: m.update(target=[1, 2])) or
                         "field 'target': must be an object", "manifest"),
}


@pytest.mark.slow
def test_a_lying_data_directory_is_refused_by_name(tiny_target: Path, prepared: Any,
                                                   tmp_path: Path) -> None:
    """Every crafted data directory: `train` exits 1 with one line naming the file, the field or
    tensor and the sample, before a single step (no run directory content beyond the record)."""
    failures = []
    for i, (name, (craft, where)) in enumerate(CRAFTS.items()):
        data = copy_data(prepared, tmp_path / f"data{i}")
        want = craft(data)
        path = data / "manifest.json" if where == "manifest" else shards(data)[0]
        p = train(tiny_target, data, tmp_path / f"run{i}", "--max-steps", "2")
        line = last_line(p) if p.stderr.strip() else ""
        if p.returncode != 1 or not line.startswith(f"error: {path}: {want}"):
            failures.append(f"{name}: exit {p.returncode}: {line}")
        elif (tmp_path / f"run{i}" / "final").exists():
            failures.append(f"{name}: final/ exported")
    assert not failures, "\n".join(failures)


def test_bad_jsonl_lines_are_named(tiny_target: Path, tmp_path: Path) -> None:
    """Non-UTF-8 bytes and 50,000 nested brackets: `prepare` and `vocab build` name the file and
    line instead of a UnicodeDecodeError or RecursionError."""
    first, second = (json.dumps({"conversations": c}).encode() for c in chats(2, 0))
    cases = {b"\xff\xfe not text": "not UTF-8 (byte 0xff at column 1)",
             b"[" * 50_000 + b"]" * 50_000: "invalid JSON (nested too deeply)"}
    for i, (bad, why) in enumerate(cases.items()):
        src = tmp_path / f"c{i}.jsonl"
        src.write_bytes(first + b"\n" + second + b"\n" + bad + b"\n")
        p = run_engine("prepare", "--target", str(tiny_target), "--data", str(src), "--out",
                       str(tmp_path / f"out{i}"), check=False)
        assert p.returncode == 1 and last_line(p) == f"error: {src}:3: {why}", p.stderr[-800:]
        counts = json.dumps({"input_ids": [1, 2], "loss_mask": [0, 1]}).encode()
        src.write_bytes(counts + b"\n" + bad + b"\n")
        p = run_engine("vocab", "build", "--data", str(src), "--vocab-size", "512",
                       "--draft-vocab-size", "8", "--out", str(tmp_path / "v.safetensors"),
                       check=False)
        assert p.returncode == 1 and last_line(p) == f"error: {src}:2: {why}", p.stderr[-800:]


# -- defect 9: a full disk during train, a tampered optimizer state ----------------------------

def file_size_limit(nbytes: int) -> Any:
    """preexec_fn: no file written may grow past `nbytes` (RLIMIT_FSIZE: writes fail with EFBIG,
    since Python ignores SIGXFSZ), a full disk for files of a checkpoint's size."""
    import resource

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return cap


def test_a_full_disk_stops_train_with_a_worded_line_and_no_best(tiny_target: Path,
                                                                prepared: Any,
                                                                tmp_path: Path) -> None:
    steps = ["--max-steps", "2", "--save-every", "1"]
    train(tiny_target, prepared[0], tmp_path / "sizes", *steps, check=True)
    ck = tmp_path / "sizes" / "checkpoints" / "step_000001"
    model, optim = (ck / "model.safetensors").stat().st_size, (ck / "optimizer.pt").stat().st_size
    best = (tmp_path / "sizes" / "best" / "model.safetensors").stat().st_size
    limit = (max(model, best) + optim) // 2
    assert max(model, best) < limit < optim, (model, best, optim)
    run = tmp_path / "run"
    p = train(tiny_target, prepared[0], run, *steps, preexec_fn=file_size_limit(limit))
    assert p.returncode == 1, p.stderr[-2000:]
    assert last_line(p) == (
        f"error: {run / 'checkpoints' / 'step_000001' / 'optimizer.pt'}: cannot write the "
        "checkpoint (the write failed; is the disk full?); the previous checkpoint stays the "
        "latest")
    assert not (run / "best").exists() and not (run / "final").exists()
    assert not (run / "checkpoints" / "step_000001").exists()
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp")]
    assert json.loads((run / "run.json").read_text())["status"] == "failed"


def test_a_tampered_optimizer_state_is_refused_by_name(tiny_target: Path, prepared: Any,
                                                       tmp_path: Path) -> None:
    run = tmp_path / "run"
    steps = ["--max-steps", "4", "--save-every", "2", "--keep", "2"]
    train(tiny_target, prepared[0], run, *steps, check=True)
    shutil.rmtree(run / "checkpoints" / "step_000004")
    (run / "checkpoints" / "latest").write_text("step_000002\n")
    opt = run / "checkpoints" / "step_000002" / "optimizer.pt"
    state = torch.load(opt, weights_only=True)
    state["state"][1]["exp_avg"] = torch.zeros(3, 3)  # another tensor's shape
    torch.save(state, opt)
    p = train(tiny_target, prepared[0], run, *steps, "--resume")
    assert p.returncode == 1, p.stderr[-2000:]
    assert last_line(p).startswith(
        f"error: {opt}: tensor 'exp_avg' of parameter 1 has shape [3, 3], ")
    opt.write_bytes(b"PK\x03\x04 not a zip")
    p = train(tiny_target, prepared[0], run, *steps, "--resume")
    assert p.returncode == 1 and last_line(p).startswith(
        f"error: {opt}: not a loadable weights-only torch file ("), last_line(p)


# -- defect 10: non-finite config values are refused, and only strict JSON is written ----------

def test_non_finite_config_values_are_refused(tmp_path: Path) -> None:
    from tests.drafters import tiny_config, write_drafter
    d = tmp_path / "drafter"
    write_drafter(d, tiny_config())
    conf = json.loads((d / "config.json").read_text())
    for field, value, named in (("rms_norm_eps", float("inf"), "rms_norm_eps"),
                                ("rope_scaling", {"rope_type": "linear", "factor": float("nan")},
                                 "rope_scaling.factor")):
        (d / "config.json").write_text(json.dumps({**conf, field: value}))  # Infinity, NaN
        want = (f"error: {d / 'config.json'}: config field {named!r}: not a finite number "
                "(NaN or Infinity)")
        p = run_engine("inspect", str(d), check=False)
        assert p.returncode == 1 and last_line(p) == want, p.stderr[-800:] + p.stdout[-800:]
        out = tmp_path / f"out-{field}"
        p = run_engine("convert", str(d), str(out), "--to", "vllm", check=False)
        assert p.returncode == 1 and last_line(p) == want, p.stderr[-800:]
        assert not out.exists()


def test_a_target_config_with_nan_is_refused_by_field(tiny_target: Path,
                                                     tmp_path: Path) -> None:
    """A NaN in the target's (text) config would be copied into the drafter (rms_norm_eps,
    rope_theta) and train NaN without a word: read_config, which every command reading a
    target goes through, refuses it by field."""
    target = tmp_path / "target"
    shutil.copytree(tiny_target, target)
    conf = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**conf, "rms_norm_eps": float("nan")}))
    data = tmp_path / "c.jsonl"
    data.write_text("".join(json.dumps({"conversations": c}) + "\n" for c in chats(2, 0)))
    out = tmp_path / "data"
    p = run_engine("prepare", "--target", str(target), "--data", str(data), "--out", str(out),
                   check=False)
    assert p.returncode == 1 and last_line(p) == (
        f"error: {target / 'config.json'}: field 'rms_norm_eps': not a finite number "
        "(NaN or Infinity)"), p.stderr[-800:]
    assert not out.exists()


def test_the_json_writer_writes_strict_json_only(tmp_path: Path) -> None:
    from engine.errors import EngineError
    from engine.fileio import write_json
    path = tmp_path / "x.json"
    try:
        write_json(path, {"loss": float("nan")})
    except EngineError as e:
        assert str(e).startswith(f"{path}: not written (Out of range float values")
    else:
        raise AssertionError("NaN was written")
    assert not path.exists() and not list(tmp_path.iterdir())
