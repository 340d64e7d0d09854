"""The training loop: EAGLE-3 training-time test on prepared target features.

Launch (the same command on one process or under torchrun):
    python -m engine train --target T --data DATA --out RUN
    python -m engine train --target T --data DATA --out RUN --finetune-from PUBLIC_DRAFTER
    torchrun --nproc-per-node 8 -m engine train --target T --data DATA --out RUN [--fsdp]
    python -m engine train ... --resume          # continue RUN from checkpoints/latest

Per step: every rank runs its micro-batches of the plan (engine/training/plan.py), the K-step TTT
unroll (engine/model/draft.py) and the loss of engine/model/ttt_loss.py; DDP (or FSDP) averages
gradients; AdamW (0.9, 0.95), grad-norm clip, warmup + cosine schedule. bf16 autocast on CUDA,
float32 on CPU. Rank 0 alone writes: events (stdout with --events, and RUN/events.jsonl so a console
that reconnects can catch up), RUN/run.json, checkpoints (engine/training/checkpointing.py), and at
the end RUN/final/ (the drafter in the EAGLE style vLLM and SGLang load) and RUN/best/ (the
checkpoint with the best estimated acceptance length on held-out samples).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from engine import __version__, stop_hold
from engine.ckpt.checks import require_finite
from engine.ckpt.config_styles import to_eagle_dict
from engine.dist import Dist, maybe_init_dist, shutdown
from engine.errors import EngineError
from engine.events import SERVED, Emitter
from engine.fileio import read_json, reason, termination_raises, write_json
from engine.model.ttt_loss import TargetSide, step_rows, summarize, target_argmax
from engine.training.checkpointing import (
    check_optimizer_state,
    latest_dir,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from engine.training.config import TrainConfig
from engine.training.memory_plan import resolve_pack
from engine.training.plan import Step, epoch_steps, split_holdout, steps_ahead
from engine.training.served_eval import ServedEval
from engine.training.setup import Setup, build
from engine.training.unroll import Unroll

# sha256 of what a run reads (engine/training/setup.py's provenance)
INPUT_HASHES = ("data_sha256", "vocab_sha256", "target_config_sha256")


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warmup to 1 over `warmup` steps, then cosine to 0 at `total`."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def _quiet() -> Emitter:
    return Emitter("train", json_mode=False, out=io.StringIO(), err=io.StringIO())


class Trainer:
    """One run: setup, the step loop, checkpoints and exports (module docstring)."""

    def __init__(self, cfg: TrainConfig, dist: Dist, ev: Emitter, argv: list[str]) -> None:
        self.cfg, self.dist, self.ev, self.argv = cfg, dist, ev, argv
        self.out = Path(cfg.out)
        self.ckpt_root = self.out / "checkpoints"
        self.dev = dist.device
        self.cuda = self.dev.type == "cuda"
        self.amp = self.cuda and cfg.precision == "bf16"  # bf16 autocast, CUDA only
        self.timers: dict[str, float] = {}

    # -- setup ---------------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        resume_from = latest_dir(self.ckpt_root) if self.ckpt_root.is_dir() else None
        if resume_from is not None and not cfg.resume:
            raise EngineError(f"--out {cfg.out}: holds checkpoints already (pass --resume to "
                              "continue it, or choose a new --out)")
        if cfg.resume and resume_from is None:
            self.ev.log(f"--resume: no checkpoint in {self.ckpt_root} yet; starting fresh",
                        level="warning")
        if cfg.fsdp and not self.dist.enabled:
            self.ev.log("--fsdp: one process, nothing to shard (launch with torchrun)",
                        level="warning")
        self.setup_: Setup = build(cfg, self.ev, self.dev)
        data = self.setup_.data
        hold = cfg.holdout if cfg.holdout is not None else min(64, len(data) // 20)
        self.train_idx, self.hold_idx = split_holdout(len(data), hold)
        self.served: ServedEval | None = None
        if cfg.eval_server and self.dist.main:
            self.served = self._open_served(cfg.eval_server)
        self.group = self.dist.world * cfg.grad_accum
        ck = load_checkpoint(resume_from) if cfg.resume and resume_from is not None else None
        self.pack = resolve_pack(cfg, self.setup_.draft.config, self.dev, self.dist.world,
                                 max(data.lengths, default=1), ck, self.ev)
        self.plans: dict[int, list[Step]] = {}
        per_epoch = [len(self.epoch(e)) for e in range(cfg.epochs)]
        if per_epoch[0] == 0:
            raise EngineError(f"--data {cfg.data}: {len(self.train_idx)} training samples make no "
                              f"full step of {self.group} micro-batches (world size x "
                              "--grad-accum); use fewer ranks or more data")
        self.total = sum(per_epoch) if cfg.max_steps is None else min(sum(per_epoch),
                                                                       cfg.max_steps)
        self.warmup = int(self.total * cfg.warmup_ratio)
        draft = self.setup_.draft.to(self.dev)
        self.draft = draft
        self.draft_ids = (draft.d2t + torch.arange(draft.d2t.numel(), device=self.dev))
        # The target side needs the draft-vocab rows of its lm_head (p), and the full head only
        # for the argmax of data that does not store it (read and moved on first use).
        self.head_d = self.setup_.lm_head.rows(self.draft_ids.cpu()).to(self.dev)
        self.lm_head: Tensor | None = None
        self.step, self.pos = 0, (0, 0)
        self.best_tau, self.best_step = -1.0, 0
        self.tau_ema: float | None = None
        self.held_out: tuple[int, float | None] = (-1, None)  # (step, tau) of the last estimate
        if ck is not None:  # weights go in before any wrapping: every rank reads the files
            self._restore_model(resume_from, ck)  # type: ignore[arg-type]
        if cfg.freeze_lm_head:
            draft.lm_head.weight.requires_grad_(False)
        draft.checkpoint_activations = cfg.checkpoint_activations
        if cfg.compile:
            draft.compile_step()
        self.module: nn.Module = Unroll(draft, cfg.ttt_steps)
        if self.dist.enabled and cfg.fsdp:
            from torch.distributed.fsdp import fully_shard
            fully_shard(self.module)  # replaces the parameters: the optimizer comes after
        elif self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel
            self.module = DistributedDataParallel(
                self.module, device_ids=[self.dev.index] if self.cuda else None,
                broadcast_buffers=False)  # d2t/t2d never change; no collective in eval forwards
        params = [p for p in self.module.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95),
                                     weight_decay=cfg.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: lr_factor(s, self.total, self.warmup))
        if ck is not None:
            self._restore_state(resume_from, ck)  # type: ignore[arg-type]

    def epoch(self, e: int) -> list[Step]:
        if e not in self.plans:
            self.plans[e] = epoch_steps(self.train_idx, self.setup_.data.lengths,
                                        self.pack or self.cfg.batch_tokens, self.group,
                                        self.cfg.seed, e, self.pack is not None)
        return self.plans[e]

    def _settings(self) -> dict[str, Any]:
        out = {k: getattr(self.cfg, k) for k in TrainConfig.RESUME_KEYS}
        for k in ("target", "data", "finetune_from", "vocab"):
            out[k] = os.path.abspath(out[k]) if out[k] else out[k]
        out["world_size"], out["pack_tokens"] = self.dist.world, self.pack
        return out

    def _restore_model(self, path: Path, ck: dict[str, Any]) -> None:
        tr = ck["trainer"]
        mine = self._settings()
        for k, v in tr.get("settings", {}).items():
            if mine.get(k) != v:
                raise EngineError(f"--resume: setting {k!r} is {mine.get(k)!r} but the run in "
                                  f"{self.cfg.out} used {v!r}")
        self._require_same_inputs(path, tr)
        missing, unexpected = self.draft.load_state_dict(
            {**ck["model"], "embed_tokens.weight": self.draft.embed_tokens.weight}, strict=False)
        if missing or unexpected:
            raise EngineError(f"{path}/model.safetensors: tensors do not match the drafter "
                              f"({(missing or unexpected)[0]!r})")

    def _inputs(self) -> dict[str, Any]:
        """What the run reads, by content: recorded in each checkpoint, compared on --resume."""
        p = self.setup_.provenance
        return {k: p.get(k) for k in INPUT_HASHES}

    def _require_same_inputs(self, path: Path, tr: dict[str, Any]) -> None:
        """--resume continues the same run only on the same data, vocab and target (checkpoints
        from before this check: run.json's record), unless the user overrides it by name."""
        was = tr.get("inputs")
        if not isinstance(was, dict):
            with contextlib.suppress(EngineError):
                was = read_json(self.out / "run.json")
        if not isinstance(was, dict):
            return
        now = self._inputs()
        names = {"data_sha256": f"the data ({self.cfg.data})", "vocab_sha256": "the draft vocab",
                 "target_config_sha256": f"the target's config ({self.cfg.target})"}
        changed = [f"{names[k]}: sha256 {str(was[k])[:12]}.. then, {str(now[k])[:12]}.. now"
                   for k in INPUT_HASHES if was.get(k) and now.get(k) and was[k] != now[k]]
        if not changed:
            return
        what = "; ".join(changed)
        if self.cfg.resume_despite_changed_data:
            self.ev.log(f"--resume-despite-changed-data: continuing {path} although {what} "
                        "changed", level="warning")
            return
        raise EngineError(f"--resume: {what} changed since {path} (the run would mix them); "
                          "pass --resume-despite-changed-data to continue anyway, or choose a "
                          "new --out")

    def _restore_state(self, path: Path, ck: dict[str, Any]) -> None:
        tr = ck["trainer"]
        try:
            if self.dist.enabled and self.cfg.fsdp:
                from torch.distributed.checkpoint.state_dict import (
                    StateDictOptions,
                    set_optimizer_state_dict,
                )
                set_optimizer_state_dict(self.module, self.opt, ck["optimizer"],
                                         options=StateDictOptions(full_state_dict=True))
            else:
                self.opt.load_state_dict(ck["optimizer"])
        except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as e:
            raise EngineError(f"{path / 'optimizer.pt'}: not this drafter's optimizer state "
                              f"({str(e).splitlines()[0][:120]})") from None
        check_optimizer_state(self.opt, path / "optimizer.pt")
        self.sched.load_state_dict(tr["scheduler"])
        self.step, self.pos = int(tr["step"]), (int(tr["epoch"]), int(tr["step_in_epoch"]))
        self.best_tau, self.best_step = float(tr["best_tau"]), int(tr["best_step"])
        self.tau_ema = tr.get("tau_ema")
        rngs = ck["rng"]
        set_rng_state(rngs[self.dist.rank] if self.dist.rank < len(rngs) else rngs[0])
        self.ev.log(f"resumed from {path} at step {self.step}")

    # -- one step ------------------------------------------------------------------------------
    def _timed(self, name: str) -> contextlib.AbstractContextManager[None]:
        trainer = self

        class _T(contextlib.ContextDecorator):
            def __enter__(self) -> None:
                if trainer.cuda:
                    torch.cuda.synchronize()
                self.t = time.perf_counter()

            def __exit__(self, *exc: object) -> None:
                if trainer.cuda:
                    torch.cuda.synchronize()
                trainer.timers[name] = trainer.timers.get(name, 0.0) + time.perf_counter() - self.t
        return _T()

    def _micro(self, idx: tuple[int, ...], denom: float, grad: bool, packed: bool = False
               ) -> Tensor:
        """Forward (+ backward when grad) of one micro-batch (one packed row when `packed`);
        returns its stats vector."""
        # Offline, a batch is read from the shards; online, reading it runs the target.
        with self._timed("target" if self.cfg.online else "data"):
            data = self.setup_.data
            b = {k: v.to(self.dev, non_blocking=True)
                 for k, v in (data.packed(idx) if packed else data.batch(idx)).items()}
        seg = b.get("segments")
        with self._timed("target"), torch.no_grad():
            top = b.get("target_argmax")
            if top is None:
                if self.lm_head is None:
                    self.lm_head = self.setup_.lm_head.full().to(self.dev)
                top = target_argmax(b["hidden"], self.lm_head)
            in_vocab = self.draft.t2d[top]
            rows = step_rows(b["loss_mask"], in_vocab, self.cfg.ttt_steps, seg)  # the loss's
        # p over the draft vocab is made chunk by chunk inside the loss, from the target's rows
        target = TargetSide(b["hidden"], self.head_d, top, in_vocab)
        with self._timed("draft"), torch.autocast("cuda", torch.bfloat16, enabled=self.amp):
            loss, stats = self.module(b["aux"].float(), b["input_ids"], b["attention_mask"],
                                      rows, target, b["loss_mask"], denom, seg)
        if grad:
            with self._timed("backward"):
                (loss * self.dist.world).backward()  # DDP averages: undo it, denom is global
        return stats

    def train_step(self, step: Step) -> dict[str, float]:
        self.timers = {}
        t0 = time.perf_counter()
        lengths = self.setup_.data.lengths
        denom = float(max(1, sum(self.setup_.data.loss_counts[i] for i in step.samples())))
        mine = step.for_rank(self.dist.rank, self.dist.world)
        stats = torch.zeros(3 * self.cfg.ttt_steps + 2, dtype=torch.float64, device=self.dev)
        for a, idx in enumerate(mine):
            last = a == len(mine) - 1
            sync = contextlib.nullcontext()
            if not last and hasattr(self.module, "no_sync"):
                sync = self.module.no_sync()  # type: ignore[operator]
            with sync:
                stats += self._micro(idx, denom, grad=True,
                                     packed=self.pack is not None)
        self.dist.all_reduce_sum(stats)
        with self._timed("optimizer"):
            gnorm = torch.nn.utils.clip_grad_norm_(
                [p for p in self.module.parameters() if p.requires_grad], self.cfg.clip)
            if hasattr(gnorm, "full_tensor"):  # FSDP: a replicated DTensor
                gnorm = gnorm.full_tensor()
            m: dict[str, Any] = summarize(stats.cpu(), self.cfg.ttt_steps)
            self._require_finite(step, m["loss"], float(gnorm))  # before the weights move
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad(set_to_none=True)
        ack = getattr(self.setup_.data, "ack", None)
        if ack is not None:  # a streamed source may drop what this step read
            ack(self.step + 1)
        dt = time.perf_counter() - t0
        tokens = sum(lengths[i] for i in step.samples())
        m.update(lr=self.lr_at(self.step), grad_norm=float(gnorm), tokens_per_s=tokens / dt,
                 tokens=tokens, epoch=step.epoch, step_time_s=dt)
        for k, v in self.timers.items():
            m[f"t_{k}_s"] = v
        return m

    def _require_finite(self, step: Step, loss: float, gnorm: float) -> None:
        """A diverged step ends the run (every rank sees the same reduced numbers): the weights
        stay as they were, and nothing non-finite is ever saved or exported."""
        what = ("the loss" if not math.isfinite(loss) else
                "the gradient norm" if not math.isfinite(gnorm) else None)
        if what is None:
            return
        names = [self.setup_.data.describe(i) for i in step.samples()]
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        raise EngineError(f"step {self.step + 1}: {what} is not finite "
                          f"({loss if what == 'the loss' else gnorm}) on the batch of {shown} "
                          f"(data {self.cfg.data}); the run stops, nothing of this step is saved")

    def lr_at(self, step: int) -> float:
        return self.cfg.lr * lr_factor(step, self.total, self.warmup)

    @torch.no_grad()
    def estimate(self) -> float | None:
        """Estimated acceptance length on the held-out samples (None without a holdout)."""
        if not self.hold_idx:
            return None
        from engine.training.plan import micro_batches
        stats = torch.zeros(3 * self.cfg.ttt_steps + 2, dtype=torch.float64, device=self.dev)
        mine = micro_batches(self.hold_idx, self.setup_.data.lengths, self.cfg.batch_tokens)
        split = self.dist.enabled and not self.cfg.fsdp  # FSDP: every rank runs every batch
        for idx in mine[self.dist.rank::self.dist.world] if split else mine:
            stats += self._micro(idx, 1.0, grad=False)
        if split:
            self.dist.all_reduce_sum(stats)
        return summarize(stats.cpu(), self.cfg.ttt_steps)["tau"]

    # -- saving --------------------------------------------------------------------------------
    def _full_state(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        model = {k: v for k, v in self.draft.state_dict().items() if k != "embed_tokens.weight"}
        if self.dist.enabled and self.cfg.fsdp:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_optimizer_state_dict,
            )
            opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
            model = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v)
                     for k, v in model.items()}
            return model, get_optimizer_state_dict(self.module, self.opt, options=opts)
        return model, self.opt.state_dict()

    def checkpoint(self, tau_est: float | None) -> None:
        model, optim = self._full_state()
        require_finite(model, f"step {self.step}: checkpoint")
        rngs: list[Any] = [None] * self.dist.world
        if self.dist.enabled:
            torch.distributed.all_gather_object(rngs, rng_state())
        else:
            rngs = [rng_state()]
        self.held_out = (self.step, tau_est)  # exports and inspect show it (None: no holdout)
        if not self.dist.main:
            return
        score = tau_est if tau_est is not None else (self.tau_ema or 0.0)
        better = score > self.best_tau
        if better:
            self.best_tau, self.best_step = score, self.step
        trainer = {"step": self.step, "epoch": self.pos[0], "step_in_epoch": self.pos[1],
                   "total_steps": self.total, "scheduler": self.sched.state_dict(),
                   "best_tau": self.best_tau, "best_step": self.best_step,
                   "tau_ema": self.tau_ema, "held_out_tau": tau_est,
                   "world_size": self.dist.world,
                   "settings": self._settings(), "inputs": self._inputs(),
                   "engine": __version__}
        path = save_checkpoint(self.ckpt_root, self.step, to_eagle_dict(self.draft.config),
                               model, optim, trainer, rngs, self.cfg.keep)
        self.ev.log(f"checkpoint {path.name}" + (f" (held-out tau {tau_est:.3f})"
                                                  if tau_est is not None else ""))
        if better:  # only once its checkpoint is on disk: best/ never names a missing step
            self.export("best", model, {"step": self.step, "estimated_tau": score,
                                        "held_out_tau": tau_est})
        if self.served is not None:
            self.measure_served(model, path.name, tau_est)

    def export(self, name: str, model: dict[str, Tensor], extra: dict[str, Any],
               to: str = "eagle") -> Path:
        """RUN/<name>/ in a style (EAGLE: the one vLLM and SGLang load; `vllm` for a swap into
        a running server), in the drafter's dtype (ckpt/drafter_save.py)."""
        from engine.ckpt.drafter_save import save_drafter
        cfg = self.draft.config
        dst = self.out / name
        dtype = getattr(torch, cfg.torch_dtype)
        sd = {k: (v.to(dtype) if v.is_floating_point() else v).cpu() for k, v in model.items()}
        require_finite(sd, f"{dst}: step {self.step}")  # bf16 may overflow to inf
        try:
            save_drafter(dst, cfg, sd, to, include_embed=False, force=True,
                         provenance={"run": str(self.out.resolve()), **extra,
                                     **self.setup_.provenance, "training": self._flags()})
        except OSError as e:  # the previous export stays whole (written aside, then renamed)
            raise EngineError(f"{dst}: cannot write the drafter ({reason(e)}; is the disk "
                              "full?)") from None
        return dst

    # -- served acceptance (train --eval-server) -----------------------------------------------
    def _open_served(self, url: str) -> ServedEval:
        """The serving endpoint, its original drafter read (rank 0 alone talks to it)."""
        from engine.training.evaluate import prompt_of
        data = self.setup_.data
        prompts = [p for p in (prompt_of(*data.tokens(i)) for i in self.hold_idx) if p]
        if not prompts:
            raise EngineError(f"--eval-server {url}: no held-out sample with a prompt to replay "
                              "(--holdout, or more data)")
        served = ServedEval(url, prompts, self.cfg.eval_server_tokens,
                            self.cfg.eval_server_drafter, self.cfg.eval_server_deadline,
                            state_dir=self.out / "served", resume=self.cfg.resume)
        now = served.open()
        if served.swapped:  # a resumed run found its own checkpoint in the server
            served.hold_stop(60, from_stop=True)
        self.ev.log(f"eval server {served.url}: {now}; each checkpoint is swapped in and "
                    f"measured on {len(prompts)} held-out prompts, the drafter swapped back "
                    "at the end")
        return served

    def measure_served(self, model: dict[str, Tensor], name: str,
                       tau_est: float | None) -> None:
        """Export the checkpoint for vLLM, swap it in, replay: a SERVED metric event. A failed
        measurement is a warning (training goes on); the original comes back at the end."""
        assert self.served is not None
        folder = self.out / "served" / name
        self.served.hold_stop(60, from_stop=True)
        try:
            self.export(f"served/{name}", model, {"step": self.step, "held_out_tau": tau_est},
                        to="vllm")
            values, version = self.served.measure(str(folder))
        except Exception as e:  # noqa: BLE001 - whatever the server did, training goes on
            why = str(e) if isinstance(e, EngineError) else f"{type(e).__name__}: {e}"
            self.ev.log(f"checkpoint {name}: served acceptance not measured ({why})",
                        level="warning")
            return
        self.served.hold_stop(60, from_stop=True)   # what a cut stop leaves: this version now
        self.ev.metric(values, step=self.step, name=SERVED)
        tau = values.get("acceptance_length")  # the event has the figures; this says where
        self.ev.log(f"checkpoint {name} served by {self.served.url} as {version} (swapped in "
                    f"{values['swap_s']:.3f} s): acceptance length "
                    + (f"{tau:.3f}" if isinstance(tau, float) else "- (no drafts)"))
        if values.get("other_tokens"):
            self.ev.log(f"checkpoint {name}: the server generated "
                        f"{values['other_tokens']} tokens for others meanwhile: the figures "
                        "include their drafts", level="warning")
        for old in (self.out / "served").iterdir():  # the server holds the weights now
            if old.name != name and old.name.startswith("step_"):
                shutil.rmtree(old, ignore_errors=True)

    def restore_served(self, failing: bool) -> None:
        """Swap the server's original drafter back (end of run, stop, failure). A failure to do
        so fails a run that had succeeded; on a failing run it is a warning beside its error."""
        served: ServedEval | None = getattr(self, "served", None)
        if served is None or not served.swapped or served.given_up:
            return
        folder = served.original[0] if served.original else "?"
        served.hold_stop(30)   # a stop waits for this (the runner's SIGKILL held off)
        try:
            version = served.restore()
        except Exception as e:  # noqa: BLE001 - a broken server is worded, never a traceback
            why = str(e) if isinstance(e, EngineError) else f"{type(e).__name__}: {e}"
            stop_hold.leave(served.left_note())
            msg = (f"{served.url} still serves a checkpoint of this run: could not swap "
                   f"{folder} back ({why}); {served.left_note()}")
            if not failing:
                raise EngineError(msg) from None
            self.ev.log(msg, level="error")
            return
        stop_hold.release()
        self.ev.log(f"eval server {served.url}: swapped its drafter back ({version})")

    def _flags(self) -> dict[str, Any]:
        """How the step ran (recorded in exports' provenance; run.json has every setting)."""
        c = self.cfg
        return {"ttt_steps": c.ttt_steps, "freeze_lm_head": c.freeze_lm_head,
                "compile": c.compile, "checkpoint_activations": c.checkpoint_activations,
                "precision": c.precision if self.cuda else "fp32"}

    def write_run_json(self, status: str, started: str, final: dict[str, Any] | None = None,
                       error: str | None = None) -> None:
        if not self.dist.main:
            return
        prov = getattr(self, "setup_", None)
        p = prov.provenance if prov is not None else {}
        ft = p.get("finetune")
        obj = {"argv": self.argv, "engine": __version__, "world_size": self.dist.world,
               "status": status, "started": started,
               "ended": None if status == "running" else time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "settings": self.cfg.to_plain(),
               "finetune": ft, "data_sha256": p.get("data_sha256"),
               "vocab_sha256": p.get("vocab_sha256"), "total_steps": getattr(self, "total", None),
               "step": getattr(self, "step", 0), "final_metrics": final, "error": error,
               "best": {"step": getattr(self, "best_step", 0),
                        "estimated_tau": getattr(self, "best_tau", None)}}
        write_json(self.out / "run.json", obj, default=str)

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        last: dict[str, Any] = {}
        try:
            self.setup()
            self.write_run_json("running", started)
            self.ev.log(f"training {self.total} steps on {len(self.train_idx)} samples "
                        f"({len(self.hold_idx)} held out), world size {self.dist.world}, "
                        f"{self.dev.type}")
            saved_at = self.step if self.cfg.resume else -1
            self._plan_stream()
            epoch, start = self.pos
            while self.step < self.total and epoch < self.cfg.epochs:
                steps = self.epoch(epoch)
                self._schedule(steps[start:start + self.total - self.step])
                for s in steps[start:]:
                    if self.step >= self.total:
                        break
                    last = self.train_step(s)
                    self.step += 1
                    self.pos = (epoch, s.index + 1)
                    tau = last["tau"]
                    self.tau_ema = tau if self.tau_ema is None else 0.9 * self.tau_ema + 0.1 * tau
                    self.ev.metric(last, step=self.step)
                    self.ev.progress(self.step, self.total, unit="step", desc="train")
                    if (self.cfg.save_every and self.step % self.cfg.save_every == 0
                            and self.step < self.total):
                        self.checkpoint(self.estimate())
                        saved_at = self.step
                epoch, start = epoch + 1, 0
                self.pos = (epoch, 0)
            if saved_at != self.step:
                self.checkpoint(self.estimate())
            model, _ = self._full_state()  # a collective under FSDP: every rank calls it
            if self.dist.main:
                held_out = self.held_out[1] if self.held_out[0] == self.step else None
                self.export("final", model, {"step": self.step, "held_out_tau": held_out})
            self.restore_served(failing=False)
            self.dist.barrier()
            finish = getattr(self.setup_.data, "finish", None)
            if finish is not None and self.dist.main:
                finish()
            final = {**last, "best_step": self.best_step, "best_estimated_tau": self.best_tau}
            self.write_run_json("done", started, final)
            return {"run": str(self.out), "steps": self.step, "final": str(self.out / "final"),
                    "best": str(self.out / "best"), "metrics": final}
        except BaseException as e:
            status = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
            try:
                self.restore_served(failing=True)
            finally:  # run.json ends whatever the swap back did
                with contextlib.suppress(Exception):
                    self.write_run_json(status, started, last or None,
                                        f"{type(e).__name__}: {e}".splitlines()[0])
            raise
        finally:
            close = getattr(getattr(self, "setup_", None) and self.setup_.data, "close", None)
            if close is not None:
                close()

    def _plan_stream(self) -> None:
        """Tell a store-fed source (engine/stream/stream_data.py) every step still to come."""
        plan = getattr(self.setup_.data, "plan_steps", None)
        if plan is None:
            return
        plan(steps_ahead(self.epoch, self.pos, self.total - self.step, self.cfg.epochs),
             self.hold_idx, self.step, self.dist.rank, self.dist.world)

    def _schedule(self, steps: list[Step]) -> None:
        """Tell a streamed data source (engine/capture/online_data.py) which batches come next."""
        schedule = getattr(self.setup_.data, "schedule", None)
        if schedule is not None:
            schedule([idx for s in steps for idx in s.for_rank(self.dist.rank, self.dist.world)])


def train(cfg: TrainConfig, ev: Emitter, argv: list[str] | None = None) -> dict[str, Any]:
    """Run training (distributed when launched by torchrun). Rank 0 reports through `ev`."""
    dist = maybe_init_dist(cfg.device)
    trainer: Trainer | None = None
    try:
        if dist.main:
            os.makedirs(cfg.out, exist_ok=True)
            ev.add_sink(os.path.join(cfg.out, "events.jsonl"))
        dist.barrier()
        trainer = Trainer(cfg, dist, ev if dist.main else _quiet(),
                          list(sys.argv if argv is None else argv))
        # with a serving endpoint, a stop (SIGTERM) unwinds so its drafter is swapped back
        with termination_raises() if cfg.eval_server else contextlib.nullcontext():
            return trainer.run()
    finally:
        del trainer  # FSDP's modules and DTensor states hold the group: freed before it goes
        shutdown(dist)
