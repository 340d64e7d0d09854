"""engine/capture/vllm_stream.py's PlanFeed without vLLM: an engine stand-in whose states are a
function of the prompt's ids. The producer's requests, in the plan's order and after a restarted
trainer's new plan, each get their own sample's states; engine calls follow the plan's order
within --batch-tokens, and what was prefilled for the old plan is not handed out for the new.
(The feed through real vLLM into a real trainer: tests/engine/capture/test_vllm_capture_engine.py.)
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from engine.capture.vllm_engine import Captured
from engine.capture.vllm_stream import PlanFeed
from engine.data.chat import Tokenized
from engine.stream import keys
from engine.stream.plan_order import PlanOrder
from tests.engine_helpers import run_engine

LENGTHS = [5, 7, 3, 8, 4, 6, 9, 2]


def states(ids: list[int]) -> Tensor:
    return torch.tensor(ids, dtype=torch.float32)[:, None, None].expand(len(ids), 4, 2).clone()


class Engine:
    """vLLM's part: each call's prompts recorded, states that name their sample."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.thens: list[list[int] | None] = []  # the call each one said would come next

    def prefill(self, prompts: list[list[int]], with_logprobs: set[int],
                then: tuple[list[list[int]], set[int]] | None = None) -> list[Captured]:
        self.calls.append([p[0] // 100 for p in prompts])
        self.thens.append(None if then is None else [p[0] // 100 for p in then[0]])
        return [Captured(states(p), None) for p in prompts]


def features(sid: str, ids: list[int], cap: Captured, check: bool) -> tuple[Tensor, Tensor]:
    return cap.states[:, :3].reshape(len(ids), -1), cap.states[:, 3]


def feed(plan: PlanOrder, pool: set[str], batch_tokens: int) -> tuple[PlanFeed, Engine, Any]:
    # sample j's ids are 100 * j + position: its states say whose they are
    samples = [(f"s{j}", Tokenized([100 * j + k for k in range(n)], [1] * n))
               for j, n in enumerate(LENGTHS)]
    cp = SimpleNamespace(samples=samples, order=list(range(len(samples))))
    producer = SimpleNamespace(plan=plan, run="r", pool=SimpleNamespace(keys=pool))
    engine = Engine()
    fd = PlanFeed(engine, features, cp, producer, batch_tokens, 0)  # type: ignore[arg-type]
    return fd, engine, producer


def owner(sample: Any) -> int:
    return int(sample.hidden[0, 0]) // 100


def test_samples_come_in_the_plans_order_batched_and_after_a_new_plan() -> None:
    first = PlanOrder(0, "a", (6,), ((0, (3, 1)), (0, (0, 7)), (0, (5, 2)), (0, (4,))))
    f, engine, producer = feed(first, set(), batch_tokens=16)
    try:
        asked = [6, 3, 1, 0]
        got = [owner(f(i)) for i in asked]
        assert got == asked
        # packed in the plan's order, at most 16 tokens a call (9+8, then 7+5+...)
        assert engine.calls[:2] == [[6], [3, 1]]
        # each call named the next one, sent to vLLM before its own outputs are awaited
        assert engine.thens[:2] == [[3, 1], engine.calls[2]]
        assert all(sum(LENGTHS[j] for j in c) <= 16 or len(c) == 1 for c in engine.calls)
        # a restarted trainer's new plan, another order; held-out 6 still in the pool
        producer.plan = PlanOrder(1, "b", (6,), ((0, (4, 2)), (0, (0, 7)), (0, (5,))))
        producer.pool.keys = {keys.held_key("r", 6)}
        rest = [4, 2, 0, 7, 5]
        assert [owner(f(i)) for i in rest] == rest
        # a sample the producer passes over (put before, still in the pool) is skipped
        producer.plan = PlanOrder(2, "c", (), ((1, (1, 2, 3)),))
        producer.pool.keys = set()
        assert owner(f(1)) == 1 and owner(f(3)) == 3
        assert f.tokens == sum(LENGTHS[j] for j in [*asked, *rest, 1, 3])
    finally:
        f.close()


def test_bad_input_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    conv = tmp_path / "conv.jsonl"
    conv.write_text("")
    base = ["stream-capture", "--data", str(conv), "--to", "127.0.0.1:1/2"]
    for extra, says in ((["--target", str(tmp_path), "--run", "a/../b"], "--run 'a/../b'"),
                        (["--target", str(tmp_path), "--run", "r"], "config.json: no such file"),
                        (["--target", str(tmp_path), "--run", "r", "--to", "x"], "--to 'x'")):
        p = run_engine(*base, *extra, check=False)
        assert p.returncode != 0 and "Traceback" not in p.stderr
        assert says in p.stderr.strip().splitlines()[-1], p.stderr
