"""Offline evaluation of a drafter on its host: `python -m engine eval` run there through the
engine client, its answer parsed once into an EvalResult (the Checkpoints pane's `e` and the
`eagle3-console eval` subcommand).

The transformers path (the default) replays greedy speculative decoding with the target loaded
by the engine; `vllm_engine` runs the target in vLLM with the drafter as its speculative config
and counts with vLLM's own counters, for targets transformers cannot hold
(docs/engine-cli.md#which-evaluation). Either way the figures are the engine's: mean acceptance
length (1 + accepted per draft, vLLM's definition) and the acceptance rate at each draft
position.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from console.checkpoints.results import _is_int, _is_number
from console.errors import ConsoleError
from console.hosts.engine_client import run_engine
from console.hosts.host import Host
from engine import events


@dataclass(frozen=True)
class EvalRequest:
    """What to evaluate: the drafter, its target, held-out data (all folders on the host)."""

    draft: str
    target: str
    data: str
    k: int = 3
    max_samples: int = 64
    vllm_engine: bool = False

    def args(self) -> list[str]:
        """The `engine eval` arguments (checked here so a typo never reaches the host)."""
        for name, value in (("drafter", self.draft), ("target", self.target),
                            ("data", self.data)):
            if not value.strip():
                raise ConsoleError(f"{name}: empty path")
        if not 1 <= self.k <= 16:
            raise ConsoleError(f"k: {self.k} is not in 1..16")
        if self.max_samples < 1:
            raise ConsoleError(f"samples: {self.max_samples} must be >= 1")
        # `=`: a folder named like an option (`-x`) stays the option's value
        return ["eval", f"--draft={self.draft}", f"--target={self.target}",
                f"--data={self.data}", "--steps", str(self.k),
                "--max-samples", str(self.max_samples),
                *(["--vllm-engine"] if self.vllm_engine else [])]


@dataclass(frozen=True)
class EvalResult:
    """engine eval's answer (engine/training/evaluate.py, vllm_eval.py), as the console shows it."""

    acceptance_length: float
    per_position: tuple[float, ...]
    drafts: int
    samples: int | None
    k: int
    path: str      # "transformers" or "vLLM engine"

    @classmethod
    def parse(cls, d: object, k: int, path: str) -> EvalResult:
        if not isinstance(d, dict):
            raise ConsoleError(f"engine eval answered {type(d).__name__}, not a result")
        tau, pos, drafts = d.get("acceptance_length"), d.get("per_position"), d.get("drafts")
        if not _is_number(tau) or not isinstance(tau, (int, float)):
            raise ConsoleError(f"engine eval: acceptance_length {tau!r} is not a number "
                               "(no draft was made: are the held-out samples empty?)")
        if not isinstance(pos, list) or not all(_is_number(p) for p in pos):
            raise ConsoleError(f"engine eval: per_position {str(pos)[:80]} is not a list of "
                               "numbers")
        if not _is_int(drafts) or not isinstance(drafts, int):
            raise ConsoleError(f"engine eval: drafts {drafts!r} is not a whole number")
        samples = d.get("samples")
        return cls(float(tau), tuple(float(p) for p in pos), drafts,
                   samples if _is_int(samples) else None, k, path)

    def line(self) -> str:
        """One line, as `engine eval` prints it."""
        pos = ", ".join(f"{p:.3f}" for p in self.per_position)
        samples = f", {self.samples} samples" if self.samples is not None else ""
        return (f"acceptance length {self.acceptance_length:.2f} (k={self.k}); per position "
                f"{pos} ({self.drafts} drafts{samples}; {self.path})")

    def to_json(self) -> dict[str, object]:
        return {"acceptance_length": self.acceptance_length,
                "per_position": list(self.per_position), "drafts": self.drafts,
                "samples": self.samples, "k": self.k, "path": self.path}


async def evaluate_checkpoint(host: Host, req: EvalRequest,
                              on_event: Callable[[events.Event], None] | None = None
                              ) -> EvalResult:
    """Run `engine eval` on the host; its figures. Raises EngineError with the engine's message
    (a drafter that does not fit the target, data without held-out samples, …)."""
    data = await run_engine(host, req.args(), on_event=on_event, timeout=None)
    return EvalResult.parse(data, req.k, "vLLM engine" if req.vllm_engine else "transformers")
