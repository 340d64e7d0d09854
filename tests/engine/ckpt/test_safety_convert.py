"""convert and inspect never destroy what is not theirs, never hang, and clean up after
themselves."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.cli import main
from tests.drafters import random_state, tiny_config, write_drafter
from tests.engine_helpers import REPO, engine_env


def engine(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine", *map(str, args)], cwd=REPO,
                          env=engine_env(EAGLE3_HASH_CACHE="0"), capture_output=True, text=True,
                          timeout=timeout)


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# -- 9: DST equal to, inside or containing SRC ---------------------------------------------------


def test_dst_an_ancestor_of_src_is_refused_and_src_survives(tmp_path: Path) -> None:
    """The reported case, through the real command line: `convert nest/src nest --force`."""
    nest = tmp_path / "nest"
    write_drafter(nest / "src")
    before = snapshot(nest)
    r = engine("convert", nest / "src", nest, "--to", "eagle", "--force")
    assert r.returncode == 1
    line = one_line(r.stderr)
    assert str(nest) in line and "contains the source" in line, line
    assert snapshot(nest) == before  # SRC intact, nothing added beside it


def _symlink_to(target: str):  # type: ignore[no-untyped-def]
    def make(w: Path) -> Path:
        (w / "link").symlink_to(target)
        return w / "link"
    return make


DST_CASES = {
    "same": lambda w: w / "nest" / "src",
    "same_via_dotdot": lambda w: w / "nest" / "src" / "sub" / ".." ,
    "parent_via_dotdot": lambda w: w / "nest" / "src" / "..",
    "grandparent": lambda w: w,
    "inside": lambda w: w / "nest" / "src" / "out",
    "symlink_to_src": _symlink_to("nest/src"),
    "symlink_to_parent": _symlink_to("nest"),
    "symlink_to_inside": _symlink_to("nest/src/config.json"),
}


@pytest.mark.parametrize("case", sorted(DST_CASES))
def test_dst_related_to_src_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture,
                                       case: str) -> None:
    w = tmp_path / "w"
    write_drafter(w / "nest" / "src")
    (w / "nest" / "src" / "sub").mkdir()
    dst = DST_CASES[case](w)
    before = snapshot(w)
    links = sorted(p.name for p in w.iterdir())
    capsys.readouterr()
    assert main(["convert", str(w / "nest" / "src"), str(dst), "--to", "eagle", "--force"]) == 1
    line = one_line(capsys.readouterr().err)
    assert "source" in line, line
    assert snapshot(w) == before
    assert sorted(p.name for p in w.iterdir()) == links  # the link itself is still there too


def test_dst_containing_the_embed_target_is_refused(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    from tests.drafters import write_target_embedding

    write_drafter(tmp_path / "src")
    write_target_embedding(tmp_path / "models" / "target", tiny_config())
    before = snapshot(tmp_path / "models")
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "models"), "--to", "vllm",
                 "--embed-from", str(tmp_path / "models" / "target"), "--force"]) == 1
    assert "--embed-from target" in one_line(capsys.readouterr().err)
    assert snapshot(tmp_path / "models") == before


# -- --force replaces a drafter directory, nothing else ------------------------------------


def console_convert(tmp_path: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """`python -m console convert local ...` with a config whose `local` host is this Python."""
    cfg = tmp_path / "console.toml"
    cfg.write_text(f'[hosts.local]\npython = "{sys.executable}"\nroot = "{tmp_path / "root"}"\n')
    env = engine_env(EAGLE3_HASH_CACHE="0")
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
        env[var] = str(tmp_path / var.lower())
    return subprocess.run([sys.executable, "-m", "console", "--config", str(cfg), "convert",
                           "local", *map(str, args)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def _notes_dir(w: Path) -> Path:
    (w / "out").mkdir()
    (w / "out" / "notes.txt").write_text("my notes")
    return w / "out"


def _nested_notes(w: Path) -> Path:
    (w / "out" / "deep").mkdir(parents=True)
    (w / "out" / "deep" / "old.txt").write_text("old")
    return w / "out"


def _plain_file(w: Path) -> Path:
    (w / "out").write_text("a file in the way")
    return w / "out"


def _symlink_to_drafter(w: Path) -> Path:
    write_drafter(w / "elsewhere", seed=5)
    (w / "out").symlink_to(w / "elsewhere")
    return w / "out"


def _drafter_plus_notes(w: Path) -> Path:
    write_drafter(w / "out", seed=5)
    (w / "out" / "notes.txt").write_text("my notes")
    return w / "out"


def _trainer_checkpoint(w: Path) -> Path:
    write_drafter(w / "out", seed=5)
    (w / "out" / "optimizer.pt").write_bytes(b"optimizer state")
    (w / "out" / "trainer.json").write_text("{}")
    return w / "out"


NOT_OURS = {"notes": (_notes_dir, "notes.txt"), "nested": (_nested_notes, "deep/"),
            "file": (_plain_file, "is not a directory"),
            "symlink": (_symlink_to_drafter, "is a symlink"),
            "drafter_plus_notes": (_drafter_plus_notes, "notes.txt"),
            "trainer_checkpoint": (_trainer_checkpoint, "optimizer.pt")}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(NOT_OURS))
def test_force_refuses_what_is_not_a_drafter_directory(tmp_path: Path, case: str) -> None:
    """`convert --force` removed a plain directory holding notes.txt."""
    w = tmp_path / "w"
    write_drafter(w / "src")
    make, named = NOT_OURS[case]
    dst = make(w)
    before, names = snapshot(w), sorted(p.name for p in w.iterdir())
    r = engine("convert", w / "src", dst, "--to", "eagle", "--force")
    assert r.returncode == 1
    line = one_line(r.stderr)
    assert str(dst) in line and named in line and "not replaced" in line, line
    assert snapshot(w) == before and sorted(p.name for p in w.iterdir()) == names
    assert os.path.islink(dst) == (case == "symlink")


def test_console_convert_force_refuses_a_notes_folder(tmp_path: Path) -> None:
    w = tmp_path / "w"
    write_drafter(w / "src")
    dst = _notes_dir(w)
    r = console_convert(tmp_path, w / "src", dst, "--to", "vllm", "--force")
    assert r.returncode == 1, r.stderr
    line = one_line(r.stderr)
    assert line.startswith("error: local: ") and "notes.txt" in line and str(dst) in line, line
    assert (dst / "notes.txt").read_text() == "my notes" and os.listdir(dst) == ["notes.txt"]


def _sharded_download(w: Path) -> Path:
    write_drafter(w / "out", layout="sharded", seed=5)
    (w / "out" / "generation_config.json").write_text("{}")
    return w / "out"


def _empty_dir(w: Path) -> Path:
    (w / "out").mkdir()
    return w / "out"


def _earlier_conversion(w: Path) -> Path:
    assert main(["convert", str(w / "src"), str(w / "out"), "--to", "sglang"]) == 0
    return w / "out"


OURS = {"sharded_download": _sharded_download, "empty": _empty_dir,
        "earlier_conversion": _earlier_conversion}


@pytest.mark.parametrize("case", sorted(OURS))
def test_force_replaces_a_drafter_directory_without_leftovers(tmp_path: Path, case: str) -> None:
    w = tmp_path / "w"
    write_drafter(w / "src")
    OURS[case](w)
    r = engine("convert", w / "src", w / "out", "--to", "eagle", "--force")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in w.iterdir()) == ["out", "src"]
    assert sorted(p.name for p in (w / "out").iterdir()) == [
        "config.json", "model.safetensors", "provenance.json"]  # no owner file either


def test_console_convert_force_replaces_an_earlier_conversion(tmp_path: Path) -> None:
    w = tmp_path / "w"
    write_drafter(w / "src")
    _earlier_conversion(w)
    r = console_convert(tmp_path, w / "src", w / "out", "--to", "vllm", "--force")
    assert r.returncode == 0, r.stderr
    prov = json.loads((w / "out" / "provenance.json").read_text())
    assert prov["format"] == "vllm"


# -- 15: hostile inputs: one clear line, no hang, for inspect and convert ------------------------


def _metadata(d: Path, value: object) -> None:
    """Rewrite model.safetensors' header with `__metadata__` set to `value`."""
    p = d / "model.safetensors"
    data = p.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header["__metadata__"] = value
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    p.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + n:])


@pytest.mark.parametrize("command", ["inspect", "convert"])
@pytest.mark.parametrize("value", ["a string", ["a", "list"], 7])
def test_metadata_that_is_not_an_object(tmp_path: Path, capsys: pytest.CaptureFixture,
                                        command: str, value: object) -> None:
    write_drafter(tmp_path / "src")
    _metadata(tmp_path / "src", value)
    capsys.readouterr()
    args = ["inspect", str(tmp_path / "src")] if command == "inspect" else [
        "convert", str(tmp_path / "src"), str(tmp_path / "out"), "--to", "eagle"]
    assert main(args) == 1
    line = one_line(capsys.readouterr().err)
    assert str(tmp_path / "src" / "model.safetensors") in line and "__metadata__" in line, line
    assert not (tmp_path / "out").exists()


def _fifo_weights(d: Path) -> Path:
    (d / "model.safetensors").unlink()
    os.mkfifo(d / "model.safetensors")
    return d / "model.safetensors"


def _fifo_config(d: Path) -> Path:
    (d / "config.json").unlink()
    os.mkfifo(d / "config.json")
    return d / "config.json"


def _fifo_bin(d: Path) -> Path:
    shutil.rmtree(d)
    write_drafter(d, layout="bin")
    (d / "pytorch_model.bin").unlink()
    os.mkfifo(d / "pytorch_model.bin")
    return d / "pytorch_model.bin"


def _fifo_shard(d: Path) -> Path:
    shutil.rmtree(d)
    write_drafter(d, layout="sharded")
    shard = sorted(d.glob("model-*.safetensors"))[1]
    shard.unlink()
    os.mkfifo(shard)
    return shard


FIFOS = {"weights": ("inspect", _fifo_weights), "config": ("convert", _fifo_config),
         "bin": ("inspect", _fifo_bin), "shard": ("convert", _fifo_shard)}


@pytest.mark.parametrize("case", sorted(FIFOS))
def test_a_fifo_is_refused_without_blocking(tmp_path: Path, case: str) -> None:
    """A real subprocess: a reader that opened the FIFO would wait for a writer forever."""
    command, make = FIFOS[case]
    write_drafter(tmp_path / "src")
    fifo = make(tmp_path / "src")
    args = [command, tmp_path / "src"] + ([tmp_path / "out", "--to", "eagle"]
                                          if command == "convert" else [])
    # a reader that opened the FIFO would never return: the timeout (TimeoutExpired) is the
    # blocking check; a wall-clock bound would only measure the engine's start on a busy machine
    r = engine(*args, timeout=120)
    assert r.returncode == 1, r.stderr
    line = one_line(r.stderr)
    assert str(fifo) in line and "not a regular file (a FIFO)" in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["inspect", "convert"])
def test_a_symlink_loop_source(tmp_path: Path, capsys: pytest.CaptureFixture,
                               command: str) -> None:
    (tmp_path / "loop").symlink_to("loop")
    args = ["inspect", str(tmp_path / "loop")] if command == "inspect" else [
        "convert", str(tmp_path / "loop"), str(tmp_path / "out"), "--to", "eagle"]
    assert main(args) == 1
    line = one_line(capsys.readouterr().err)
    assert line == f"error: {tmp_path / 'loop'}: too many levels of symbolic links"


def _index_entry(d: Path, value: str) -> str:
    """Point one weight_map entry at `value` (a valid shard copied outside the checkpoint, so
    that only the path rule can stop it); returns the tensor name."""
    idx = d / "model.safetensors.index.json"
    index = json.loads(idx.read_text())
    name = sorted(index["weight_map"])[0]
    shard = d / index["weight_map"][name]
    outside = d.parent / "outside.safetensors"
    shutil.copy(shard, outside)
    for k, v in index["weight_map"].items():  # every tensor of that shard, so it would load
        if v == shard.name:
            index["weight_map"][k] = value.replace("OUTSIDE", str(outside))
    shard.unlink()
    idx.write_text(json.dumps(index))
    return name


def _absolute(d: Path) -> tuple[str, str]:
    return _index_entry(d, "OUTSIDE"), "absolute path"


def _dotdot(d: Path) -> tuple[str, str]:
    return _index_entry(d, "../outside.safetensors"), "leads outside"


def _symlink_out(d: Path) -> tuple[str, str]:
    name = _index_entry(d, "linked.safetensors")
    (d / "linked.safetensors").symlink_to(d.parent / "outside.safetensors")
    return name, "leads outside"


WMAP = {"absolute": _absolute, "dotdot": _dotdot, "symlink": _symlink_out}


@pytest.mark.parametrize("command", ["inspect", "convert"])
@pytest.mark.parametrize("case", sorted(WMAP))
def test_weight_map_outside_the_checkpoint_is_refused(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture,
                                                      case: str, command: str) -> None:
    src = tmp_path / "ck" / "src"
    write_drafter(src, layout="sharded")
    name, words = WMAP[case](src)
    capsys.readouterr()
    args = ["inspect", str(src)] if command == "inspect" else [
        "convert", str(src), str(tmp_path / "out"), "--to", "eagle"]
    assert main(args) == 1
    line = one_line(capsys.readouterr().err)
    assert str(src / "model.safetensors.index.json") in line and repr(name) in line, line
    assert words in line, line
    assert not (tmp_path / "out").exists()


def test_hub_cache_snapshot_links_into_blobs_still_load(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    """The Hugging Face cache keeps shards in `blobs/` and links them from `snapshots/REV/`:
    those links lead outside the snapshot but stay in the repository, and must keep working."""
    repo = tmp_path / "models--org--drafter"
    snap = repo / "snapshots" / "0123abc"
    write_drafter(tmp_path / "plain", layout="sharded")
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted((tmp_path / "plain").iterdir())):
        blob = repo / "blobs" / f"{i:064x}"
        shutil.copy(f, blob)
        (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    assert main(["inspect", str(snap), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


# -- 10: interrupted converts clean up; the next convert removes stale temp dirs -----------------


@pytest.fixture(scope="module")
def big_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A drafter with a 96 MiB lm_head: a convert of it lasts long enough to be caught mid-way
    (about a second, mostly the sha256), whatever the machine's speed."""
    cfg = tiny_config(vocab_size=65536, draft_vocab_size=65536, hidden_size=384,
                      num_attention_heads=6, num_key_value_heads=2, intermediate_size=64)
    state = random_state(cfg)
    del state["d2t"], state["t2d"]
    d = tmp_path_factory.mktemp("big") / "src"
    write_drafter(d, cfg=cfg, state=state)
    return d


def temps(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if ".tmp-" in n)


def _default_stop_signals() -> None:
    for s in (signal.SIGHUP, signal.SIGINT):
        signal.signal(s, signal.SIG_DFL)


def start_and_stop_midway(src: Path, w: Path) -> subprocess.Popen[str]:
    """Start a real convert into w/out and freeze it (SIGSTOP) as soon as its temp dir appears,
    then check it really is mid-way: temp present, DST absent."""
    p = subprocess.Popen([sys.executable, "-m", "engine", "convert", str(src), str(w / "out"),
                          "--to", "eagle"], cwd=REPO, env=engine_env(EAGLE3_HASH_CACHE="0"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         # a runner under nohup (SIGHUP) or in a background job (SIGINT) hands
                         # them down ignored: the convert must see them
                         preexec_fn=_default_stop_signals)
    deadline = time.monotonic() + 120
    while not temps(w) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    os.kill(p.pid, signal.SIGSTOP)
    assert temps(w) and not (w / "out").exists(), "convert was not caught mid-way"
    return p


@pytest.mark.parametrize("sig, last_line", [(signal.SIGTERM, "stopped by SIGTERM"),
                                             (signal.SIGHUP, "stopped by SIGHUP"),
                                             (signal.SIGINT, "error: interrupted")])
def test_a_stop_signal_midway_leaves_nothing(tmp_path: Path, big_src: Path, sig: int,
                                             last_line: str) -> None:
    w = tmp_path / "w"
    w.mkdir()
    p = start_and_stop_midway(big_src, w)
    os.kill(p.pid, sig)
    os.kill(p.pid, signal.SIGCONT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + sig, err
    assert last_line in err.strip().splitlines()[-1]
    assert os.listdir(w) == []


def test_sigkill_midway_then_the_next_convert_removes_the_stale_temp(
        tmp_path: Path, big_src: Path) -> None:
    w = tmp_path / "w"
    w.mkdir()
    p = start_and_stop_midway(big_src, w)
    os.kill(p.pid, signal.SIGKILL)
    p.communicate(timeout=60)  # reaped: the PID is gone
    stale = temps(w)
    assert len(stale) == 1 and f"-{p.pid}-" in stale[0]
    write_drafter(tmp_path / "small")  # the sweep is by DST: a small source keeps this quick
    r = engine("convert", tmp_path / "small", w / "out", "--to", "eagle")
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(w)) == ["out"]
    assert f"removed {w / stale[0]}" in r.stderr


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temp_rules(tmp_path: Path) -> None:
    """Only our shape with a gone owner is removed: a live owner, a foreign file, a foreign
    name or a symlink are kept; a PID now used by another process (this test's, with a start
    time that differs) counts as gone."""
    from engine.ckpt.output_dir import OWNER_FILE, process_start

    w = tmp_path / "w"
    write_drafter(w / "src")
    me, dead = os.getpid(), _dead_pid()
    me_start = process_start(me)
    assert me_start

    def temp(name: str, owner: dict | None, extra: str | None = None) -> Path:
        d = w / name
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"partial")
        if owner is not None:
            (d / OWNER_FILE).write_text(json.dumps(owner))
        if extra:
            (d / extra).write_text("user data")
        return d

    gone = [temp(f".out.tmp-{dead}-0000000a", {"pid": dead, "start": "x:1"}),
            temp(f".out.tmp-{dead}-0000000b", None),  # killed before the owner file / old engine
            temp(f".out.tmp-{me}-0000000c", {"pid": me, "start": "another-boot:1"})]  # PID reused
    kept = [temp(f".out.tmp-{me}-0000000d", {"pid": me, "start": me_start}),  # live owner
            temp(f".out.tmp-{me}-0000000e", None),  # live PID, unknown start: keep
            temp(f".out.tmp-{dead}-0000000f", {"pid": dead, "start": "x:1"}, "precious.txt"),
            temp(f".out.tmp-{dead}-00000010", {"pid": dead + 1, "start": "x:1"}),
            temp(f".out.tmp-{dead}-zzzzzzzz", None),  # not our name shape
            temp(f".other.tmp-{dead}-00000011", None)]  # another DST's
    (w / f".out.tmp-{dead}-00000012").symlink_to(w / "src")
    kept.append(w / f".out.tmp-{dead}-00000012")
    r = engine("convert", w / "src", w / "out", "--to", "eagle")
    assert r.returncode == 0, r.stderr
    for d in gone:
        assert not os.path.lexists(d), d
        assert f"removed {d}" in r.stderr
    for d in kept:
        assert os.path.lexists(d), d
    assert (w / "src" / "model.safetensors").exists() and (w / "out" / "config.json").exists()


def test_a_signal_during_the_dst_swap_waits_for_the_swap(tmp_path: Path) -> None:
    """SIGTERM that lands while DST is being swapped (between the two renames) is acted on only
    once DST is whole: the new DST is in place, the old one gone, and then it stops."""
    from engine.ckpt.output_dir import Terminated, _signals_deferred, termination_raises

    before = signal.getsignal(signal.SIGTERM)
    reached = []
    with pytest.raises(Terminated), termination_raises():
        with _signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100):  # plenty of chances for a pending handler to run
                (tmp_path / "x").write_text("x")
            reached.append("end of block")
        reached.append("after the block")
    assert reached == ["end of block"]
    assert signal.getsignal(signal.SIGTERM) == before


def test_dst_reaching_src_through_a_bind_mount_is_refused(tmp_path: Path) -> None:
    """No path comparison sees `view/src` is `nest/src` when `view` is a bind mount of `nest`;
    (device, inode) does. Needs a private mount namespace (root or user namespaces)."""
    w = tmp_path / "w"
    write_drafter(w / "nest" / "src")
    (w / "view").mkdir()
    before = snapshot(w / "nest")
    mount = ["unshare", "-m", "--propagation", "private", "sh", "-c",
             'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh", str(w / "nest"),
             str(w / "view")]
    if shutil.which("unshare") is None or subprocess.run(
            [*mount, "true"], capture_output=True, timeout=30).returncode != 0:
        pytest.skip("no private mount namespace here (needs root or user namespaces)")
    r = subprocess.run([*mount, sys.executable, "-m", "engine", "convert", str(w / "nest" / "src"),
                        str(w / "view" / "src"), "--to", "eagle", "--force"], cwd=REPO,
                       env=engine_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert "is the source" in one_line(r.stderr)
    assert snapshot(w / "nest") == before
