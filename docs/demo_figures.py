"""Regenerate the demo acceptance table of docs/benchmarks.md: `make figures`.

In a scratch directory (`--work`, default /tmp/eagle3-figures) the demo workspace is built with
`python -m engine demo init` (timed), then for each seed the demo's own scratch and finetune
commands (demo.json, the console's profiles) run for the same number of steps (timed: the
finetune's seconds are the README's tour figure), and `python -m engine eval` (k=3, the 40 held-out
samples, greedy) measures an untrained drafter, the public drafter and every run's out/final.
With a vLLM beside it (.venv-vllm, `make setup-vllm`; `--no-vllm` to skip), the public drafter and
each finetune are measured again through vLLM's own engine and counters (`engine eval
--vllm-engine`, which agrees with a `vllm serve` server within 10%). Prints a Markdown table to
paste into docs/benchmarks.md and the timings below it. Nothing outside --work is written."""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
# the demo's own environment for its runs (console/demo/config.py): one thread each
ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def engine(*args: str, python: str = sys.executable, extra_env: dict[str, str] | None = None
           ) -> tuple[str, float]:
    """`python -m engine ARGS` from this checkout: its stdout and wall-clock seconds."""
    env = dict(os.environ, PYTHONPATH=str(REPO), **ENV, **(extra_env or {}))
    t0 = time.monotonic()
    p = subprocess.run([python, "-m", "engine", *args], cwd=REPO, env=env, capture_output=True,
                       text=True)
    if p.returncode != 0:
        raise SystemExit(f"engine {' '.join(args)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return p.stdout, time.monotonic() - t0


def run_words(info: dict[str, Any], kind: str, out: Path, steps: int, seed: int) -> list[str]:
    """The workspace's suggested `engine train` command for KIND, its --out, steps and seed set."""
    words = shlex.split(info["commands"][kind])[3:]  # after `python -m engine`
    words[words.index("--out") + 1] = str(out)
    words[words.index("--max-steps") + 1] = str(steps)
    return [*words, "--seed", str(seed)]


def untrained(ws: Path, info: dict[str, Any], dst: Path) -> Path:
    """A scratch run's drafter before its first step (seed 0), saved EAGLE style."""
    import torch

    from engine.ckpt.drafter_save import save_drafter
    from engine.events import Emitter
    from engine.training.config import TrainConfig
    from engine.training.setup import build
    cfg = TrainConfig(target=str(ws / "target"), data=str(ws / "data"), out=str(dst) + "-run",
                      draft_vocab_size=info["draft_vocab_size"], seed=0)
    quiet = Emitter("train", out=io.StringIO(), err=io.StringIO())
    draft = build(cfg, quiet, torch.device("cpu")).draft
    save_drafter(dst, draft.config, draft.trainable_state_dict(), "eagle")
    return dst


def acceptance(ws: Path, draft: Path) -> dict[str, Any]:
    out, _ = engine("eval", "--draft", str(draft), "--target", str(ws / "target"), "--data",
                    str(ws / "eval"), "--steps", "3", "--json")
    return dict(json.loads(out))


def served(ws: Path, draft: Path, work: Path) -> float:
    """Acceptance length through vLLM's engine (the drafter exported in vLLM's style)."""
    dst = work / "vllm" / draft.parent.name
    shutil.rmtree(dst, ignore_errors=True)
    engine("convert", str(draft), str(dst), "--to", "vllm")
    out, _ = engine("eval", "--vllm-engine", "--draft", str(dst), "--target", str(ws / "target"),
                    "--data", str(ws / "eval"), "--steps", "3", "--json",
                    python=str(VLLM_PYTHON),
                    extra_env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_TARGET_DEVICE": "cpu",
                               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    return float(json.loads(out)["acceptance_length"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default="/tmp/eagle3-figures", help="the scratch directory")
    p.add_argument("--steps", type=int, help="steps of both runs (default: the demo's)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds")
    p.add_argument("--no-vllm", action="store_true", help="skip the vLLM check")
    args = p.parse_args()
    work = Path(args.work).resolve()
    ws = work / "ws"
    _, build_s = engine("demo", "init", str(ws), "--force")
    info = json.loads((ws / "demo.json").read_text(encoding="utf-8"))
    steps = args.steps or int(shlex.split(info["commands"]["finetune"])[
        shlex.split(info["commands"]["finetune"]).index("--max-steps") + 1])
    rows: dict[str, list[dict[str, Any]]] = {
        "untrained": [acceptance(ws, untrained(ws, info, work / "untrained"))],
        "public": [acceptance(ws, ws / "public-drafter")]}
    seconds: dict[str, list[float]] = {"scratch": [], "finetune": []}
    for seed in args.seeds:
        for kind in ("scratch", "finetune"):
            out = work / "runs" / f"{kind}-{seed}"
            shutil.rmtree(out, ignore_errors=True)
            _, s = engine(*run_words(info, kind, out, steps, seed))
            seconds[kind].append(s)
            rows.setdefault(kind, []).append(acceptance(ws, out / "final"))
    vllm = VLLM_PYTHON.exists() and not args.no_vllm
    served_public = served(ws, ws / "public-drafter", work) if vllm else None
    served_ft = [served(ws, work / "runs" / f"finetune-{s}" / "final", work)
                 for s in args.seeds] if vllm else []
    print(table(rows, steps, args.seeds, served_public, served_ft))
    print(f"\ndemo init {build_s:.0f} s; {steps}-step runs (seeds {args.seeds}): scratch "
          + ", ".join(f"{s:.0f}" for s in seconds["scratch"]) + " s, finetune "
          + ", ".join(f"{s:.0f}" for s in seconds["finetune"]) + " s (each a whole "
          "`engine train` call, one thread)")
    return 0


def table(rows: dict[str, list[dict[str, Any]]], steps: int, seeds: list[int],
          served_public: float | None, served_ft: list[float]) -> str:
    names = {"untrained": "untrained (a scratch run before its first step)",
             "public": "public drafter (`public-drafter/`)",
             "scratch": f"scratch, {steps} steps (EAGLE 3.1, the default)",
             "finetune": f"finetuned {steps} steps from the public drafter"}
    lines = [f"| drafter | acceptance length (seed {', '.join(map(str, seeds))}) | per position "
             "| vLLM |", "|---|---|---|---|"]
    for key, label in names.items():
        got = rows[key]
        tau = ", ".join(f"{r['acceptance_length']:.2f}" for r in got)
        pos = " / ".join(f"{x:.2f}" for x in got[0]["per_position"])
        vl = ""
        if key == "public" and served_public is not None:
            vl = f"{served_public:.2f}"
        elif key == "finetune" and served_ft:
            vl = ", ".join(f"{x:.2f}" for x in served_ft)
        lines.append(f"| {label} | {tau} | {pos} | {vl} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
