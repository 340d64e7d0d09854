"""Benchmark: our EAGLE-3 training step against speculators' (vllm-project) trainer step.

    python benchmarks/train_vs_speculators.py [--venv DIR] [--hidden 256 1024] [--k 3 7]
                                              [--lm-head trained frozen] [--repeats 3]
                                              [--steps 2] [--no-check] [--json] [--eagle31]

speculators 0.9.0 runs in its own throwaway venv, built by this script on first use (default
~/.cache/eagle3-bench/speculators-0.9.0, reused while it imports): torch==2.13.0 (the CPU build;
never another torch, CUDA wheels, torchvision or torchaudio), speculators and hs-connectors
--no-deps, and only what `import speculators.models.eagle3` needs (VENV_PACKAGES). Nothing of
speculators is copied here; its side only calls `Eagle3DraftModel.from_training_args`, its
`forward(..., verifier_last_hidden_states, ttt_steps, ttt_step_loss_decay, loss_config)` and
`resolve_loss_config("kl_div", "eager")` (the fused loss needs Triton), with the dense-mask
attention (`draft_attn_impl="sdpa"`) and a verifier directory this script writes (a Llama
config.json with the benchmark's shape, safetensors with embed_tokens, lm_head and norm).

`--eagle31`: both sides build the drafter speculators 0.9 trains by default ("EAGLE 3.1":
`norm_before_fc` and `norm_output` on; docs/eagle3.md#eagle-31-flags) for the check and the
timing alike.

(a) math check first (hidden 64, T 64, K 3, V 512, Vd 128): our weights copied into theirs, the
    same inputs in both conventions (theirs pre-shifted as its `shift_batch` does); per-TTT-step
    logits, the loss and three gradients, max differences printed. Both teacher-force the
    ground-truth tokens in later TTT steps. The objectives differ by design (printed, not hidden):
    ours soft cross-entropy over the target's draft-vocab distribution, each step divided by the
    step-0 supervised count, positions whose target argmax is outside the draft vocab masked;
    theirs KL (the same gradient, minus the target entropy), each step divided by its own count,
    no draft-vocab mask. The check feeds them our mask and recomputes their loss from our logits.
(b) the step alone, the shape of `benchmarks/train.py --step-compare` (its STEP_SHAPE: float32, 2
    threads, T=1024, batch 1, 8 heads / 4 kv heads, target vocab 32000, draft vocab 8000), our
    side being that script's own `--step-worker` (impl "new"), theirs a worker in their venv
    with the same inputs, AdamW(lr 1e-4, betas 0.9/0.95) over the trainable parameters, one
    warm-up step, then `--steps` timed steps; lm_head trained on both or frozen on both. Each
    measurement a fresh process, ours and theirs interleaved (order alternating per repeat),
    medians over repeats: tokens/s (T / fastest step), ours/theirs ratio, peak RSS above the
    after-import baseline. Goal: ratio >= 1.2x in all configurations, our peak memory <= theirs.
    Our trainer computes logits only at the positions its loss reads (engine/model/ttt_loss.py
    step_rows); theirs computes them everywhere. With this benchmark's random target, about
    Vd/V = 25% of targets fall inside the draft vocab; real data (a draft vocab of the most
    frequent tokens) covers most, but masks its prompt tokens. `--coverage 1.0` puts every
    target in the draft vocab: every position supervised, our least favourable case.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
SPECULATORS = "0.9.0"
TORCH = "2.13.0"
DEFAULT_VENV = Path.home() / ".cache" / "eagle3-bench" / f"speculators-{SPECULATORS}"
# what `import speculators.models.eagle3` pulls in (speculators.train.data imports openai and
# datasets); speculators itself and hs-connectors go in with --no-deps.
VENV_PACKAGES = ["transformers==5.19.0", "pydantic", "pydantic-settings", "loguru", "safetensors",
                 "numpy", "openai", "datasets<=5.1.0"]
NUM_TARGET_LAYERS = 8
AUX_LAYERS = [2, 4, 5]
DECAY = 0.8  # ours: engine/model/ttt_loss.py STEP_WEIGHT; theirs: ttt_step_loss_decay
CHECK = {"hidden": 64, "t": 64, "k": 3, "v": 512, "vd": 128, "heads": 8, "kv_heads": 4}


# -- the throwaway venv ----------------------------------------------------------------------------

def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def venv_ok(venv: Path) -> bool:
    py = venv_python(venv)
    if not py.exists():
        return False
    probe = (f"import torch, speculators.models.eagle3, transformers; "
             f"assert torch.__version__.split('+')[0] == '{TORCH}', torch.__version__")
    return subprocess.run([str(py), "-c", probe], capture_output=True).returncode == 0


def ensure_venv(venv: Path) -> dict[str, Any]:
    """Reuse `venv` if it imports speculators on torch TORCH, else (re)build it."""
    if venv_ok(venv):
        return {"venv": str(venv), "built": False}
    t0 = time.perf_counter()
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pin = venv / "constraints.txt"  # keeps every later install on this torch, no extras
    pin.write_text(f"torch=={TORCH}\n", encoding="ascii")
    pip = [str(venv_python(venv)), "-m", "pip", "install", "-q", "-c", str(pin)]
    for args in ([f"torch=={TORCH}"], ["--no-deps", f"speculators=={SPECULATORS}",
                                       f"hs-connectors=={SPECULATORS}"], VENV_PACKAGES):
        print(f"venv: pip install {' '.join(args)}", file=sys.stderr)
        subprocess.run(pip + args, check=True)
    if not venv_ok(venv):
        raise SystemExit(f"{venv}: speculators does not import after the install")
    return {"venv": str(venv), "built": True, "build_s": round(time.perf_counter() - t0, 1)}


# -- inputs shared by both sides -------------------------------------------------------------------

def llama_config(h: int, v: int, heads: int, kv_heads: int) -> dict[str, Any]:
    """The verifier's config.json (a Llama of the benchmark's shape)."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h,
            "intermediate_size": h * 7 // 2, "num_hidden_layers": NUM_TARGET_LAYERS,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "head_dim": h // heads, "vocab_size": v, "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "max_position_embeddings": 4096, "hidden_act": "silu", "tie_word_embeddings": False,
            "attention_bias": False, "mlp_bias": False, "dtype": "float32"}


def write_verifier(path: Path, h: int, v: int, heads: int, kv_heads: int, embed: Any = None,
                   lm_head: Any = None) -> None:
    """A verifier directory for speculators: config.json + embed_tokens, lm_head, norm."""
    import torch
    from safetensors.torch import save_file
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(llama_config(h, v, heads, kv_heads)))
    g = torch.Generator().manual_seed(1)
    if embed is None:
        embed = torch.randn(v, h, generator=g)
    if lm_head is None:
        lm_head = torch.randn(v, h, generator=g) * 0.05
    save_file({"model.embed_tokens.weight": embed.contiguous(),
               "lm_head.weight": lm_head.contiguous(),
               "model.norm.weight": torch.ones(h)}, str(path / "model.safetensors"))


def vocab_maps(v: int, vd: int) -> tuple[Any, Any]:
    """(t2d, d2t) as our step worker spreads the draft vocab: draft id i is target id i*(v//vd)."""
    import torch
    ids = torch.arange(vd) * (v // vd)
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[ids] = True
    return t2d, ids - torch.arange(vd)


# -- speculators' side (runs inside the venv: no `engine`, nothing outside it) ---------------------

def spec_model(spec: dict[str, Any], t2d: Any, d2t: Any) -> Any:
    """Eagle3DraftModel through the trainer's own constructor, dense-mask attention."""
    from speculators.models.eagle3 import Eagle3DraftModel
    from transformers import LlamaConfig
    h, heads = spec["hidden"], spec["heads"]
    cfg = {k: x for k, x in llama_config(h, spec["v"], heads, spec["kv_heads"]).items()
           if k not in ("architectures", "model_type")}
    cfg.update(num_hidden_layers=1, layer_types=["full_attention"])  # one full-attention layer
    tl = LlamaConfig(**cfg)
    return Eagle3DraftModel.from_training_args(
        verifier_config=tl, t2d=t2d, d2t=d2t, verifier_name_or_path=spec["verifier"],
        draft_vocab_size=spec["vd"], norm_before_residual=False, ttt_steps=spec["k"],
        target_layer_ids=AUX_LAYERS, draft_attn_impl="sdpa",
        norm_before_fc=bool(spec.get("eagle31")), norm_output=bool(spec.get("eagle31")))


def spec_worker(spec: dict[str, Any]) -> dict[str, Any]:
    import warnings

    import speculators.models.eagle3  # noqa: F401  (import cost is in the baseline)
    import torch
    from speculators.losses import resolve_loss_config
    from step_timing import rss_kb, time_steps  # benchmarks/ is sys.path[0]
    warnings.filterwarnings("ignore")
    torch.set_num_threads(spec["threads"])
    base_kb = rss_kb()
    h, k, t, v, vd = spec["hidden"], spec["k"], spec["t"], spec["v"], spec["vd"]
    torch.manual_seed(0)
    t2d, d2t = vocab_maps(v, vd)
    loss_config = resolve_loss_config("kl_div", "eager")
    if spec["mode"] == "check":
        return spec_check(spec, t2d, d2t, loss_config)
    model = spec_model(spec, t2d, d2t)
    model.lm_head.weight.requires_grad_(not spec.get("freeze"))
    params = [p for p in model.parameters() if p.requires_grad]
    aux = torch.randn(1, t, 3 * h)
    hidden = torch.randn(1, t, h)
    ids = torch.randint(0, v, (1, t))
    doc = torch.zeros(1, t, dtype=torch.long)
    loss_mask = torch.ones(1, t, dtype=torch.bool)
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95))

    def step() -> float:
        _, loss, _ = model(hidden_states=aux, input_ids=ids, document_ids=doc,
                           loss_mask=loss_mask, verifier_last_hidden_states=hidden,
                           ttt_steps=k, ttt_step_loss_decay=DECAY, loss_config=loss_config)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return {**time_steps(step, spec["steps"], t, base_kb),
            "trainable": sum(p.numel() for p in params)}


def spec_check(spec: dict[str, Any], t2d: Any, d2t: Any, loss_config: Any) -> dict[str, Any]:
    """(a), their side: our weights and inputs in, logits / loss / gradients out (a file)."""
    import torch
    blob = torch.load(spec["io"], weights_only=True)
    model = spec_model(spec, t2d, d2t)
    missing = model.load_state_dict(blob["weights"], strict=False)
    model.lm_head.weight.requires_grad_(True)
    logits: list[Any] = []
    model.lm_head.register_forward_hook(lambda _m, _i, out: logits.append(out.detach()))
    inp = blob["inputs"]
    _, loss, metrics = model(hidden_states=inp["aux"], input_ids=inp["ids"],
                             document_ids=torch.zeros_like(inp["ids"]),
                             loss_mask=inp["loss_mask"], position_ids=inp["position_ids"],
                             verifier_last_hidden_states=inp["hidden"], ttt_steps=spec["k"],
                             ttt_step_loss_decay=DECAY, loss_config=loss_config)
    loss.backward()
    grads = {name: p.grad.detach() for name, p in model.named_parameters()
             if p.grad is not None and name in blob["grad_names"]}
    torch.save({"logits": logits, "loss": loss.detach(), "grads": grads,
                "step_loss": [metrics[f"loss_{i}_sum"] for i in range(spec["k"])],
                "unexpected": list(missing.unexpected_keys),
                "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad)},
               spec["io"])
    return {"ok": True}


# -- our side and the check (the project's venv) ---------------------------------------------------

OUR_TO_THEIRS = {"midlayer.": "layers.0."}


def their_name(name: str) -> str:
    for a, b in OUR_TO_THEIRS.items():
        if name.startswith(a):
            return b + name[len(a):]
    return name


def math_check(venv: Path, work: Path, eagle31: bool = False) -> dict[str, Any]:
    """(a) of the docstring; returns the max differences."""
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, str(ROOT))
    from engine.model.draft import Eagle3Draft, preset, shift_left
    from engine.model.ttt_loss import draft_head, target_argmax, target_distribution, ttt_loss
    c = CHECK
    h, t, k, v, vd = c["hidden"], c["t"], c["k"], c["v"], c["vd"]
    cfg = preset("tiny").with_(hidden_size=h, intermediate_size=h * 7 // 2,
                               num_attention_heads=c["heads"], num_key_value_heads=c["kv_heads"],
                               head_dim=h // c["heads"], target_hidden_size=h, vocab_size=v,
                               draft_vocab_size=vd, max_position_embeddings=4096,
                               norm_before_fc=eagle31, norm_output=eagle31)
    torch.manual_seed(0)
    draft = Eagle3Draft(cfg)
    t2d, d2t = vocab_maps(v, vd)
    draft.d2t.copy_(d2t)
    draft.t2d.copy_(t2d)
    with torch.no_grad():  # non-trivial norm weights, so a mis-mapped norm would show
        for name, p in draft.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
    lm_head = torch.randn(v, h) * 0.3
    aux = torch.randn(1, t, 3 * h)
    hidden = torch.randn(1, t, h)
    ids = torch.randint(0, v, (1, t))
    loss_mask = torch.ones(1, t, dtype=torch.long)
    loss_mask[:, : t // 4] = 0  # a prompt
    # theirs applies the verifier's final norm (weight 1) to the hidden states it is given;
    # ours takes final-norm states: give ours the normed ones
    hidden_n = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + 1e-5)
    top = target_argmax(hidden_n, lm_head)
    p, in_vocab = target_distribution(hidden_n, draft_head(lm_head, draft.d2t + torch.arange(vd)),
                                      top, draft.t2d)
    out = draft.ttt_forward(aux, ids, k)  # [K] x [1,T,Vd]
    denom = float(loss_mask[:, 2:].sum())
    ours_loss, stats = ttt_loss(out, p, top, in_vocab, loss_mask, draft.d2t, denom)
    # their objective on our logits: KL, each step over its own count, our mask as their mask
    equiv = hidden.new_zeros(())
    for i, lg in enumerate(out):
        mask = (shift_left(loss_mask, 2 + i).bool() & shift_left(in_vocab, 1 + i)).float()
        pt = shift_left(p, 1 + i)
        kl = (pt * (torch.log(pt.clamp_min(1e-30)) - F.log_softmax(lg, -1))).sum(-1)
        equiv = equiv + DECAY ** i * (kl * mask).sum() / (mask.sum() + 1e-5)
    equiv.backward()
    names = ["fc.weight", "midlayer.self_attn.q_proj.weight", "lm_head.weight"]
    ours_grads = {their_name(n): dict(draft.named_parameters())[n].grad for n in names}
    io = work / "check.pt"
    weights = {their_name(n): x for n, x in draft.state_dict().items()
               if n not in ("d2t", "t2d", "inv_freq", "embed_tokens.weight")}
    their_mask = shift_left(loss_mask, 2).bool() & shift_left(in_vocab, 1)
    torch.save({"weights": weights, "grad_names": list(ours_grads),
                "inputs": {"aux": aux, "ids": shift_left(ids, 1), "hidden": shift_left(hidden, 1),
                           "loss_mask": their_mask, "position_ids": torch.arange(t)[None]}}, io)
    vdir = work / "verifier-check"
    write_verifier(vdir, h, v, c["heads"], c["kv_heads"], draft.embed_tokens.weight.detach(),
                   lm_head)
    spec = {**c, "mode": "check", "threads": 2, "verifier": str(vdir), "io": str(io),
            "eagle31": eagle31}
    run_spec(venv, spec)
    theirs = torch.load(io, weights_only=True)
    out = [lg.detach() for lg in out]
    logit_diff = [float((a - b).abs().max()) for a, b in zip(out, theirs["logits"], strict=True)]
    logit_scale = [float(a.abs().max()) for a in out]
    grad_diff = {n: float((ours_grads[n] - theirs["grads"][n]).abs().max()) for n in ours_grads}
    grad_scale = {n: float(ours_grads[n].abs().max()) for n in ours_grads}
    ours_trainable = sum(x.numel() for x in draft.parameters() if x.requires_grad)
    return {"shape": c, "eagle31": eagle31, "logits_max_abs_diff": logit_diff,
            "logits_max_abs": logit_scale,
            "their_loss": float(theirs["loss"]), "their_loss_on_our_logits": float(equiv.detach()),
            "loss_abs_diff": abs(float(theirs["loss"]) - float(equiv)),
            "our_loss": float(ours_loss),
            "our_step_losses": [round(float(x), 6) for x in stats[:k]],
            "their_step_losses": [round(float(x), 6) for x in theirs["step_loss"]],
            "grad_max_abs_diff": grad_diff, "grad_max_abs": grad_scale,
            "trainable_params": {"ours": ours_trainable, "theirs": theirs["trainable"]},
            "unexpected_keys": theirs["unexpected"]}


def run_spec(venv: Path, spec: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS=str(spec["threads"]), PYTHONPATH="",
               TOKENIZERS_PARALLELISM="false", TRANSFORMERS_VERBOSITY="error")
    p = subprocess.run([str(venv_python(venv)), str(HERE), "--spec-worker", json.dumps(spec)],
                       capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    if p.returncode != 0:
        raise SystemExit(f"speculators worker failed:\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_ours(spec: dict[str, Any], threads: int) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train.py"), "--step-worker",
                        json.dumps(spec)], capture_output=True, text=True, env=env, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def compare(venv: Path, work: Path, hiddens: list[int], ks: list[int], repeats: int, steps: int,
            heads: list[str], coverage: float | None = None, eagle31: bool = False
            ) -> dict[str, Any]:
    """(b) of the docstring."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from step_timing import median_rows
    from train import STEP_SHAPE  # benchmarks/train.py: the shape its step worker uses

    shape = dict(STEP_SHAPE)
    for h in hiddens:
        write_verifier(work / f"verifier-{h}", h, shape["v"], shape["heads"], shape["kv_heads"])
    configs = [(h, k, fr == "frozen") for h in hiddens for k in ks for fr in heads]
    runs: dict[tuple[int, int, bool, str], list[dict[str, Any]]] = {}
    for r in range(repeats):
        for h, k, fr in configs:
            for side in (("ours", "speculators") if r % 2 == 0 else ("speculators", "ours")):
                if side == "ours":
                    res = run_ours({"impl": "new", "hidden": h, "k": k, "freeze": fr,
                                    "steps": steps, "coverage": coverage, "eagle31": eagle31},
                                   shape["threads"])
                else:
                    res = run_spec(venv, {**shape, "mode": "time", "hidden": h, "k": k,
                                          "freeze": fr, "steps": steps, "eagle31": eagle31,
                                          "verifier": str(work / f"verifier-{h}")})
                runs.setdefault((h, k, fr, side), []).append(res)
                print(f"  repeat {r} hidden {h} K {k} frozen {fr} {side}: {res}",
                      file=sys.stderr)
    rows = median_rows(runs, configs, num="ours", den="speculators")
    for row, (h, k, fr) in zip(rows, configs, strict=True):
        row["speculators_trainable"] = runs[(h, k, fr, "speculators")][0]["trainable"]
    return {"shape": shape, "repeats": repeats, "steps": steps, "coverage": coverage,
            "eagle31": eagle31, "rows": rows}


def print_check(c: dict[str, Any]) -> None:
    s = c["shape"]
    print(f"(a) math check, hidden {s['hidden']}, T {s['t']}, K {s['k']}, V {s['v']}, "
          f"Vd {s['vd']}{', EAGLE 3.1 flags on' if c.get('eagle31') else ''}: our weights in "
          "theirs, same inputs")
    for i, (d, m) in enumerate(zip(c["logits_max_abs_diff"], c["logits_max_abs"], strict=True)):
        print(f"    TTT step {i} logits: max |diff| {d:.2e} (max |logit| {m:.2f})")
    print(f"    loss: theirs {c['their_loss']:.6f}, their objective on our logits "
          f"{c['their_loss_on_our_logits']:.6f}, |diff| {c['loss_abs_diff']:.2e}")
    print(f"    our own loss {c['our_loss']:.6f} (soft CE, steps / step-0 count): per step "
          f"ours {c['our_step_losses']}, theirs {c['their_step_losses']} (KL, own count, "
          f"x {DECAY}^i)")
    for n, d in c["grad_max_abs_diff"].items():
        print(f"    grad {n}: max |diff| {d:.2e} (max |grad| {c['grad_max_abs'][n]:.2e})")
    tp = c["trainable_params"]
    print(f"    trainable parameters: ours {tp['ours']}, theirs {tp['theirs']}"
          + (f"; keys theirs ignored: {c['unexpected_keys']}" if c["unexpected_keys"] else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--venv", default=str(DEFAULT_VENV), help="speculators' throwaway venv")
    ap.add_argument("--hidden", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--k", type=int, nargs="+", default=[3, 7])
    ap.add_argument("--lm-head", nargs="+", choices=("trained", "frozen"),
                    default=["trained", "frozen"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per process")
    ap.add_argument("--coverage", type=float, default=None,
                    help="on our side, the fraction of targets inside the draft vocab (default: "
                         "what the random target gives, ~Vd/V; 1.0: every position is "
                         "supervised, as speculators' loss always counts them)")
    ap.add_argument("--no-check", action="store_true", help="skip the math check (a)")
    ap.add_argument("--eagle31", action="store_true",
                    help="norm_before_fc and norm_output on, both sides (speculators 0.9's "
                         "default drafter)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--spec-worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.spec_worker:
        print(json.dumps(spec_worker(json.loads(args.spec_worker))))
        return 0
    venv = Path(args.venv).expanduser()
    res: dict[str, Any] = {"venv": ensure_venv(venv)}
    with tempfile.TemporaryDirectory(prefix="eagle3-vs-spec-") as tmp:
        work = Path(tmp)
        if not args.no_check:
            res["check"] = math_check(venv, work, args.eagle31)
            if not args.json:
                print_check(res["check"])
                sys.stdout.flush()
        res["compare"] = compare(venv, work, args.hidden, args.k, args.repeats, args.steps,
                                 args.lm_head, args.coverage, args.eagle31)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    cmp = res["compare"]
    print(f"(b) training step{' (EAGLE 3.1)' if args.eagle31 else ''}, ours vs speculators "
          f"{SPECULATORS}: float32, 2 threads, T=1024, "
          f"batch 1, 8/4 heads, V 32000, Vd 8000; medians of {cmp['repeats']}; targets in "
          f"the draft vocab: {'~Vd/V' if cmp['coverage'] is None else cmp['coverage']}")
    from step_timing import print_rows
    print_rows(cmp["rows"], "ours", "speculators", shown=("ours", "spec"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
