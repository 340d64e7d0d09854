"""The trainer's typed settings: one dataclass, a docstring per field, validated on creation.

`engine/commands/train.py` builds it from the command line, whose options are generated from the
fields: `--field-name` for `field_name`, its type, default and, as help, the field's docstring
(`field_docs`). A field's `metadata["cli"]` holds what argparse needs beyond that: `flags` (other
option strings), `metavar`, `choices`, `exclusive` (a mutually exclusive group's name). Tests
and the demo build it directly.
"""

from __future__ import annotations

import ast
import functools
import inspect
import os
import textwrap
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.capture.server import DEFAULT_STORAGE
from engine.errors import EngineError
from engine.training.served_eval import check_url

EAGLE_VERSIONS = ("3.0", "3.1")
# A new drafter's default flavour: EAGLE 3.1 measured at least as good as 3.0 on the demo at equal
# steps (docs/benchmarks.md, "Demo acceptance"), and it is what speculators 0.9 and vLLM 0.32
# default to.
DEFAULT_EAGLE_VERSION = "3.1"


@dataclass
class TrainConfig:
    """Everything a training run needs; see `python -m engine train --help`."""

    target: str
    """Target model directory (config.json, tokenizer, safetensors weights)."""
    data: str
    """Prepared data directory (engine/data/prepare.py) or SpecForge data_*.ckpt directory; with
    `online`, a conversations JSONL file instead."""
    out: str
    """Run directory: checkpoints/, events.jsonl, run.json, final/, best/."""
    finetune_from: str | None = field(default=None, metadata={"cli": {"metavar": "CKPT"}})
    """Drafter checkpoint to start from, in any style engine/ckpt/key_map.py detects."""
    vocab: str | None = field(default=None, metadata={"cli": {"metavar": "FILE",
                                                              "exclusive": "vocab"}})
    """Draft vocab file (from `python -m engine vocab build`) to train with."""
    rebuild_vocab: bool = field(default=False, metadata={"cli": {"exclusive": "vocab"}})
    """Build the draft vocab from DATA's assistant tokens (the most frequent), even when
    finetuning."""
    eagle_version: str | None = field(default=None, metadata={"cli": {"choices": ("3.0", "3.1")}})
    """A new drafter's flavour: "3.1" (the default, as speculators 0.9 trains: `norm_before_fc`
    and `norm_output` on) or "3.0" (both off). A finetune keeps its source's flags."""
    draft_vocab_size: int | None = None
    """Vd for a vocab built here; default min(32000, V), or the finetune source's Vd."""
    resume: bool = False
    """Continue from RUN_DIR/checkpoints/latest (model, optimizer, schedule, data position, RNG)."""
    resume_despite_changed_data: bool = False
    """With `resume`: continue even though the data, the draft vocab or the target's config
    changed since the checkpoint (their sha256 are recorded; without this flag a change is
    refused by name, since the run would mix two datasets)."""
    ttt_steps: int = 7
    """K: draft steps unrolled per batch (training-time test)."""
    lr: float = 1e-4
    """Peak learning rate (AdamW, betas 0.9/0.95, no weight decay)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    epochs: int = 10
    """Passes over the training samples (the schedule spans all of them unless max_steps)."""
    max_steps: int | None = None
    """Stop after this many optimizer steps (the schedule is sized to it)."""
    batch_tokens: int = 8192
    """Padded tokens per micro-batch per rank (longest sample x samples)."""
    pack_tokens: str | None = field(default=None, metadata={"cli": {"metavar": "N|auto|off"}})
    """Pack samples side by side into one row of up to N tokens per micro-batch per rank
    (instead of --batch-tokens' padded rows): attention block-diagonal per sample, positions
    restarting, every sample's loss and gradient as unpacked. `auto`: the largest row the
    device's free memory holds (engine/training/memory_plan.py); `off`: padded rows. Default:
    auto on a GPU, off on a CPU and with --online; --resume keeps the run's size."""
    grad_accum: int = 1
    """Micro-batches per rank per optimizer step."""
    warmup_ratio: float = 0.015
    """Share of the steps spent warming the learning rate up linearly; cosine decay after."""
    clip: float = 0.5
    """Gradient-norm clip."""
    save_every: int = 500
    """Write a checkpoint every this many steps (and at the end); 0 = only at the end."""
    keep: int = 3
    """Step checkpoints kept (the oldest are deleted; best/ and final/ are separate)."""
    seed: int = 0
    """Seed of the initial weights and of the data order."""
    holdout: int | None = None
    """Samples held out to estimate acceptance at each checkpoint (picks best/); default
    min(64, 5% of the data); 0 = choose best/ by the training estimate."""
    eval_server: str | None = field(default=None, metadata={"cli": {"metavar": "URL"}})
    """A vLLM on this host's loopback started by `serve` (weight-update routes, our drafter
    backend): each checkpoint is exported to RUN/served/, swapped into it, the held-out prompts
    replayed there (greedy, the target's own replies) and the acceptance vLLM counts is a `served
    acceptance` metric; the drafter it served before is swapped back at the end, on a stop and
    on a failure."""
    eval_server_drafter: str | None = field(default=None, metadata={"cli": {"metavar": "DIR"}})
    """With `eval_server`: the folder of the drafter it serves now, to swap back (default: the
    one it started with; needed when it serves a swapped-in drafter)."""
    eval_server_deadline: float = field(default=900.0, metadata={"cli": {"metavar": "S"}})
    """With `eval_server`: seconds one measurement may take (the swap in, the replay, the
    counters); past them it is a warning naming this deadline. The swap back has as long."""
    eval_server_tokens: int = field(default=64, metadata={"cli": {"metavar": "N"}})
    """With `eval_server`: at most this many tokens per held-out prompt (its greedy reply, to
    its end: the same tokens for every checkpoint)."""
    online: bool = False
    """Compute the target features inside the loop from conversations (`data` is a JSONL file)."""
    max_len: int = 2048
    """Token limit per conversation in online mode."""
    from_vllm: str | None = field(default=None, metadata={"cli": {"metavar": "URL"}})
    """With `online`: fetch the features from this vLLM server (engine/capture/online_data.py)
    instead of loading the target here."""
    vllm_model: str | None = field(default=None, metadata={"cli": {"flags": ("--model",)}})
    """The served model name at `from_vllm` (default: the server's first)."""
    concurrency: int = 16
    """Requests in flight to the `from_vllm` server."""
    prefetch: int = 4
    """Micro-batches requested ahead of the trainer from the `from_vllm` server."""
    server_storage: str = DEFAULT_STORAGE
    """The `from_vllm` server's storage directory (capture-server --storage): its files are
    read and deleted only there; any other path it names is refused."""
    from_stream: str | None = field(default=None, metadata={"cli": {"metavar": "ADDR"}})
    """Read the features from a stream run's store (HOST:RPC_PORT/METADATA_PORT, as the store's
    master prints it; engine/stream/stream_data.py): `data` is then the stream run's name."""
    producer_timeout: float | None = field(default=None, metadata={"cli": {"metavar": "S"}})
    """With `from_stream`: stop with one line after the producer has been silent (no heartbeat)
    for S seconds while the trainer waits; by default it waits on (saying so every few
    seconds), so a producer started again with the same command is picked up."""
    fsdp: bool = False
    """Shard the drafter with FSDP instead of replicating it with DDP (multi-process only)."""
    freeze_lm_head: bool = False
    """Keep the drafter's lm_head as it starts (speculators' default); trained by default, the
    EAGLE-3 paper's choice."""
    compile: bool = False
    """torch.compile the draft's TTT step (CPU and CUDA; the first steps pay the compile)."""
    checkpoint_activations: bool = False
    """Recompute the decoder layer of every TTT step in the backward instead of keeping its
    activations (torch.utils.checkpoint): less memory for wide drafters, about one more
    forward of the layer per step."""
    precision: str = field(default="bf16", metadata={"cli": {"choices": ("bf16", "fp32")}})
    """On CUDA: "bf16" autocast (the default) or "fp32". CPU always trains in float32."""
    device: str | None = None
    """Torch device; default cuda:LOCAL_RANK when present, else cpu."""

    def __post_init__(self) -> None:
        if self.from_stream and self.online:
            raise EngineError("--from-stream: reads features a producer streams; --online "
                              "computes them here (drop one of the two)")
        if self.from_stream:
            from engine.stream.address import StreamAddress
            from engine.stream.keys import check_run
            StreamAddress.parse(self.from_stream)
            check_run(self.data, "--data")
        if self.producer_timeout is not None and not self.producer_timeout > 0:
            raise EngineError(f"--producer-timeout {self.producer_timeout:g}: must be > 0")
        if not self.online and not self.from_stream and not os.path.isdir(self.data):
            raise EngineError(f"--data {self.data}: not a directory (prepare it first, or pass "
                              "--online with a conversations JSONL file)")
        if self.online and not os.path.isfile(self.data):
            raise EngineError(f"--data {self.data}: --online needs a conversations JSONL file")
        if not os.path.isdir(self.target):
            raise EngineError(f"--target {self.target}: not a directory")
        if self.from_vllm and not self.online:
            raise EngineError("--from-vllm: streams features for --online training (pass "
                              "--online), or capture first: engine prepare --from-vllm")
        if self.pack_tokens is not None and self.pack_tokens != "off" and self.online:
            raise EngineError("--pack-tokens: packs prepared features; --online streams them "
                              "per padded batch (drop one of the two)")
        if self.pack_tokens not in (None, "auto", "off") and not (
                str(self.pack_tokens).isdigit() and int(str(self.pack_tokens)) >= 1):
            raise EngineError(f"--pack-tokens {self.pack_tokens}: a number of tokens >= 1, auto "
                              "or off")
        if self.resume_despite_changed_data and not self.resume:
            raise EngineError("--resume-despite-changed-data: only with --resume")
        if self.vocab and self.rebuild_vocab:
            raise EngineError("--vocab and --rebuild-vocab: choose one")
        if self.vocab and not os.path.isfile(self.vocab):
            raise EngineError(f"--vocab {self.vocab}: no such file")
        if self.finetune_from and not os.path.isdir(self.finetune_from):
            raise EngineError(f"--finetune-from {self.finetune_from}: not a directory")
        for name in ("ttt_steps", "epochs", "batch_tokens", "grad_accum", "keep", "max_len",
                     "concurrency", "prefetch"):
            if getattr(self, name) < 1:
                raise EngineError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be >= 1")
        if self.max_steps is not None and self.max_steps < 1:
            raise EngineError(f"--max-steps {self.max_steps}: must be >= 1")
        if self.save_every < 0:
            raise EngineError(f"--save-every {self.save_every}: must be >= 0")
        if not 0 < self.lr < 1:
            raise EngineError(f"--lr {self.lr}: must be in (0, 1)")
        if not 0 <= self.warmup_ratio < 1:
            raise EngineError(f"--warmup-ratio {self.warmup_ratio}: must be in [0, 1)")
        if self.clip <= 0:
            raise EngineError(f"--clip {self.clip}: must be > 0")
        if self.eagle_version is not None and self.eagle_version not in EAGLE_VERSIONS:
            raise EngineError(f"--eagle-version {self.eagle_version}: choose 3.0 or 3.1")
        if self.eagle_version is not None and self.finetune_from:
            raise EngineError("--eagle-version: sets a new drafter's flags; a finetune keeps "
                              f"those of --finetune-from {self.finetune_from}")
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise EngineError(f"--draft-vocab-size {self.draft_vocab_size}: must be >= 1")
        if self.holdout is not None and self.holdout < 0:
            raise EngineError(f"--holdout {self.holdout}: must be >= 0")
        if self.eval_server is not None:
            check_url(self.eval_server)
            if self.holdout == 0:
                raise EngineError("--eval-server: replays the held-out prompts; --holdout 0 "
                                  "holds none out")
        elif self.eval_server_drafter is not None:
            raise EngineError("--eval-server-drafter: only with --eval-server")
        if self.eval_server_drafter is not None and not os.path.isdir(self.eval_server_drafter):
            raise EngineError(f"--eval-server-drafter {self.eval_server_drafter}: not a "
                              "directory")
        if not 0 < self.eval_server_deadline < float("inf"):
            raise EngineError(f"--eval-server-deadline {self.eval_server_deadline}: must be a "
                              "number of seconds > 0")
        if self.eval_server_tokens < 1:
            raise EngineError(f"--eval-server-tokens {self.eval_server_tokens}: must be >= 1")
        if self.precision not in ("bf16", "fp32"):
            raise EngineError(f"--precision {self.precision}: choose bf16 or fp32")

    def to_plain(self) -> dict[str, Any]:
        return asdict(self)

    # Settings that must match for --resume to continue the same run.
    RESUME_KEYS = ("target", "data", "finetune_from", "vocab", "rebuild_vocab", "draft_vocab_size",
                   "ttt_steps", "lr", "weight_decay", "epochs", "max_steps", "batch_tokens",
                   "pack_tokens", "grad_accum", "warmup_ratio", "clip", "seed", "holdout",
                   "online", "max_len", "fsdp", "freeze_lm_head", "precision", "eagle_version")


@functools.cache
def field_docs(cls: type = TrainConfig) -> dict[str, str]:
    """Each field's docstring, whitespace collapsed: the string literal right after the field in
    the class body, read with `ast` from the class's source."""
    cdef = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    assert isinstance(cdef, ast.ClassDef)
    docs: dict[str, str] = {}
    for stmt, nxt in zip(cdef.body, cdef.body[1:], strict=False):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs
