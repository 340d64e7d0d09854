"""vLLM's engine in this process asked in calls (a list of prompts each), every call queued
whole, and the next call queued while the one before is still stepping, so the engine steps
back to back and each call is one forward.

Whole: vLLM starts a step as soon as it holds a request, and a driver slowed by its own work
(the puts, the checks) trickled a call's requests into 2-4 steps. A call sent to an idle engine
is added while vLLM's scheduling is paused (`LLM.sleep(level=0)`, its documented way) and woken
after the last. A call sent while another is stepping is added as it is: vLLM's engine core
reads its input only between steps, so requests added during a step wait together for the next
one (a few ms to add against a step's hundreds), and the pause is not asked there: answered
between steps, it waits for the engine to hold no request, and one queued behind a wake-up
could be held so forever. With the next call queued when a step ends, the engine schedules it
at once: without chunked prefill its scheduler takes waiting requests in order and stops at the
first that does not fit the step's token budget, and a call holds as many whole samples as fit
(engine/capture/vllm_engine.py `batches`), so a step is one call.

The outputs come off `LLMEngine.step()` as vLLM's own `LLM.generate` takes them, kept by
request id until their call is received. A vLLM without the level-0 pause is asked each call
with `generate` when it is received (nothing queued ahead).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Sent:
    """One call: its request ids in vLLM (None: not queued, asked with generate on receive)."""
    ids: list[str] | None
    requests: list[Any] = field(default_factory=list)
    params: list[Any] = field(default_factory=list)


class EngineCalls:
    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.whole = True  # calls queued whole while this vLLM can
        self.done: dict[str, Any] = {}  # finished outputs of calls not yet received
        self.out = 0  # calls sent and not yet received

    def send(self, requests: list[Any], params: list[Any]) -> Sent:
        """The call queued whole (or kept, for generate, where this vLLM cannot)."""
        if self.whole:
            ids = queue_whole(self.llm, requests, params) if self.out == 0 else \
                _outputs_ids(self.llm.enqueue(requests, params, use_tqdm=False))
            if ids is not None:
                self.out += 1
                return Sent(ids)
            self.whole = False
        return Sent(None, requests, params)

    def receive(self, sent: Sent) -> list[Any]:
        """vLLM's outputs of a call, in its requests' order, once it is done."""
        if sent.ids is None:
            return list(self.llm.generate(sent.requests, sent.params, use_tqdm=False))
        self.out -= 1
        engine = self.llm.llm_engine
        while any(i not in self.done for i in sent.ids):
            for out in engine.step():
                if out.finished:
                    self.done[out.request_id] = out
        return [self.done.pop(i) for i in sent.ids]


def queue_whole(llm: Any, requests: list[Any], params: list[Any]) -> list[str] | None:
    """`requests` added with vLLM's scheduling paused, then woken; their request ids. None
    where this vLLM has no such pause (nothing was asked)."""
    if not hasattr(llm, "enqueue"):
        return None
    try:
        llm.sleep(level=0, mode="keep")
    except Exception:  # an older vLLM: no level-0 sleep, or no `mode`
        return None
    try:
        return _outputs_ids(llm.enqueue(requests, params, use_tqdm=False))
    finally:
        llm.wake_up(tags=["scheduling"])


def _outputs_ids(ids: list[Any]) -> list[str]:
    """The ids vLLM's outputs carry for the ids `enqueue` returned: vLLM keeps the ones the
    requests were added with (a counter) and returns its own, that id with "-" and 8 random
    characters appended."""
    return [str(i).rsplit("-", 1)[0] for i in ids]
