"""Benchmark: `engine convert` (eagle -> speculators) against a plain copy of the same weight files.

    .venv/bin/python benchmarks/convert.py [--preset llama3-8b] [--no-embed] [--dir D] [--rounds 3]

Builds a drafter checkpoint of at least 1 GiB (default: the Llama-3.1-8B drafter shapes in bf16
with its [V, H] embedding, ~1.9 GiB) in a temp dir, then, in each round, copies the weight file
(shutil.copyfile, with and without fsync) and converts it in a fresh process. Prints side by side:
    conversion time / plain copy time          (target <= 1.5x)
    conversion peak RSS increase / largest tensor size
Neither the copy nor the conversion fsyncs (like `cp`); a copy followed by fsync is shown too.
Every timed step starts after os.sync(), so no step pays for the previous one's writeback.
Peak RSS is the child's VmHWM (reset just before converting) minus its RSS then.
The conversion also sha256-hashes the source (provenance) on a second thread. Each round converts
twice: cold (EAGLE3_HASH_CACHE=0: the source is hashed, as on a first conversion) and warm (the
digest comes from engine/ckpt/hash_cache.py, as on every later conversion of the same file). The
hash-only time is printed too: it bounds the cold ratio (OpenSSL SHA-256 runs ~1.4 GB/s a core).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# The conversion runs in a fresh process. Its peak is VmHWM from /proc (per address space, so,
# unlike ru_maxrss, not inherited from the parent across fork), reset just before converting.
CHILD = r"""
import json, sys, time
from pathlib import Path
from engine.ckpt.converter import convert_checkpoint

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

try:
    open("/proc/self/clear_refs", "w").write("5")  # reset the high-water mark to the current RSS
except OSError:
    pass
before = status("VmRSS")
t = time.perf_counter()
convert_checkpoint(Path(sys.argv[1]), Path(sys.argv[2]), "speculators", verifier="bench/target")
dt = time.perf_counter() - t
print(json.dumps({"seconds": dt, "rss_before": before, "peak_rss": status("VmHWM")}))
"""


def build(d: Path, preset_name: str, embed: bool) -> tuple[int, str, int]:
    """Write the checkpoint tensor by tensor; returns (bytes, largest name, largest bytes)."""
    import torch

    from engine.ckpt.checks import expected_tensors
    from engine.ckpt.config_styles import to_eagle_dict
    from engine.ckpt.key_map import from_canonical
    from engine.ckpt.safetensors_io import SafetensorsWriter, itemsize, st_code, tensor_bytes
    from engine.model.draft import preset

    cfg = preset(preset_name).with_(torch_dtype="bfloat16")
    exp = expected_tensors(cfg)
    names = [n for n, x in exp.items() if x.required or n in ("t2d",)
             or (embed and n == "embed_tokens.weight")]
    dt = {"float": torch.bfloat16, "int64": torch.int64, "bool": torch.bool}
    specs = [(from_canonical(n, "eagle"), st_code(dt[exp[n].kind]), exp[n].shape) for n in names]
    d.mkdir(parents=True)
    w = SafetensorsWriter(d / "model.safetensors", specs)
    vd = cfg.draft_vocab_size
    assert vd is not None
    for (out, _, shape), n in zip(specs, names, strict=False):
        if n == "d2t":
            t = torch.zeros(vd, dtype=torch.int64)  # identity map: draft id i -> target id i
        elif n == "t2d":
            t = torch.zeros(cfg.vocab_size, dtype=torch.bool)
            t[:vd] = True
        else:  # random bits: content does not matter for a byte copy, only size
            t = torch.empty(shape, dtype=torch.int16).random_().view(torch.bfloat16)
        w.write(out, tensor_bytes(t))
        del t
    w.close()
    (d / "config.json").write_text(json.dumps(to_eagle_dict(cfg), indent=2))
    nbytes = {out: itemsize(code) * _numel(shape) for out, code, shape in specs}
    big = max(nbytes, key=lambda k: nbytes[k])
    return (d / "model.safetensors").stat().st_size, big, nbytes[big]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def plain_copy(src: Path, dst: Path, fsync: bool) -> float:
    dst.mkdir()
    t = time.perf_counter()
    for p in src.glob("*.safetensors"):
        shutil.copyfile(p, dst / p.name)
        if fsync:
            with open(dst / p.name, "rb+") as f:
                os.fsync(f.fileno())
    return time.perf_counter() - t


def convert_in_child(src: Path, dst: Path, cache: Path, cold: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(cache),
               EAGLE3_HASH_CACHE="0" if cold else "1")
    r = subprocess.run([sys.executable, "-c", CHILD, str(src), str(dst)], capture_output=True,
                       text=True, env=env, cwd=REPO, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="llama3-8b")
    ap.add_argument("--no-embed", action="store_true", help="leave the [V, H] embedding out")
    ap.add_argument("--dir", help="work directory (default: a temp dir, removed at the end)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="eagle3-bench-"))
    try:
        src = root / "src"
        t = time.perf_counter()
        size, big, big_bytes = build(src, args.preset, not args.no_embed)
        print(f"built {size / 2**30:.2f} GiB checkpoint ({args.preset}, bf16) in "
              f"{time.perf_counter() - t:.1f} s; largest tensor {big} {big_bytes / 2**20:.0f} MiB")
        if size < 2**30:
            print("warning: checkpoint is under 1 GiB")
        from engine.ckpt import hash_cache
        from engine.ckpt.safetensors_io import sha256_file

        # Prime the warm runs' cache the way a first conversion would (files younger than
        # hash_cache.FRESH_S are not remembered, so let the new file age first).
        cache = root / "cache"
        time.sleep(max(0.0, hash_cache.FRESH_S + 0.1 - (time.time() - os.stat(
            src / "model.safetensors").st_ctime)))
        os.environ["XDG_CACHE_HOME"] = str(cache)
        hash_cache.sha256_files(sorted(src.glob("*.safetensors")))
        rows = []
        for r in range(args.rounds):
            for p in ("copy", "copy_sync", "out", "out_warm"):
                shutil.rmtree(root / p, ignore_errors=True)
            # Each timed step starts with no dirty pages: otherwise whichever step crosses the
            # kernel's dirty threshold is throttled by the previous step's writeback.
            os.sync()
            c = plain_copy(src, root / "copy", fsync=False)
            shutil.rmtree(root / "copy")
            os.sync()
            cold = convert_in_child(src, root / "out", cache, cold=True)
            shutil.rmtree(root / "out")
            os.sync()
            warm = convert_in_child(src, root / "out_warm", cache, cold=False)
            shutil.rmtree(root / "out_warm")
            os.sync()
            cs = plain_copy(src, root / "copy_sync", fsync=True)
            shutil.rmtree(root / "copy_sync")
            t = time.perf_counter()
            sha256_file(src / "model.safetensors")
            h = time.perf_counter() - t
            rss = max(x["peak_rss"] - x["rss_before"] for x in (cold, warm))
            rows.append((cold["seconds"] / c, c, cs, h, cold["seconds"], rss, warm["seconds"]))
            print(f"round {r + 1}: copy {c:.2f} s, convert cold {cold['seconds']:.2f} s "
                  f"({cold['seconds'] / c:.2f}x), warm {warm['seconds']:.2f} s "
                  f"({warm['seconds'] / c:.2f}x), copy+fsync {cs:.2f} s, sha256 alone {h:.2f} s, "
                  f"convert peak RSS +{rss / 2**20:.0f} MiB")
        rows.sort()
        ratio, c, cs, h, conv_s, _, _ = rows[len(rows) // 2]  # the median round by cold ratio
        warm_rows = sorted(rows, key=lambda x: x[6] / x[1])
        _, wc, _, _, _, _, warm_s = warm_rows[len(rows) // 2]  # and the median by warm ratio
        rss = max(x[5] for x in rows)
        print(f"\nmedian of {len(rows)} rounds, each ratio's own median round (load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs):")
        print(f"{'':40}{'conversion':>12}{'baseline':>12}{'ratio':>8}")
        print(f"{'time vs plain copy, cold (hashes) (s)':40}{conv_s:>12.2f}{c:>12.2f}"
              f"{ratio:>7.2f}x  (target <= 1.5x)")
        print(f"{'time vs plain copy, warm (cached) (s)':40}{warm_s:>12.2f}{wc:>12.2f}"
              f"{warm_s / wc:>7.2f}x  (target <= 1.5x)")
        print(f"{'time vs copy + fsync, cold (s)':40}{conv_s:>12.2f}{cs:>12.2f}"
              f"{conv_s / cs:>7.2f}x")
        print(f"{'peak RSS increase vs largest tensor':40}{rss / 2**20:>9.0f} MiB"
              f"{big_bytes / 2**20:>8.0f} MiB{rss / big_bytes:>7.2f}x")
        print(f"(best cold round: {rows[0][0]:.2f}x; sha256 of the source alone took {h:.2f} s, "
              f"{h / c:.2f}x the copy: the floor of the cold ratio)")
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
