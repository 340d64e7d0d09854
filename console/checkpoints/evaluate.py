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

from console.checkpoints.answers import EvalResult
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


async def evaluate_checkpoint(host: Host, req: EvalRequest,
                              on_event: Callable[[events.Event], None] | None = None
                              ) -> EvalResult:
    """Run `engine eval` on the host; its figures. Raises EngineError with the engine's message
    (a drafter that does not fit the target, data without held-out samples, …)."""
    data = await run_engine(host, req.args(), on_event=on_event, timeout=None)
    return EvalResult.parse(data, req.k, "vLLM engine" if req.vllm_engine else "transformers")
