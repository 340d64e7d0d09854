"""Replay the same prompts against a served drafter, and measure exactly that replay (the `bench`
command's service).

Each prompt is a conversation cut before its first assistant turn, sent to the server's
`/v1/chat/completions` through the host's own connection (console/transport/http_client.py):
vLLM applies the target's own chat template, greedy (temperature 0), each reply to its end
(EOS) or max_tokens M, as served traffic stops (engine/training/served_eval.py replays the same
way; `fixed_length` generates M tokens past EOS, text no conversation holds, which no drafter
was trained on), at most C requests at once. Acceptance comes from the server's /metrics
counters read just before and just after the replay: the deltas of exactly that replay when
nothing else is served meanwhile (the counters are checked to have grown by the replay's own
generated tokens; a busier server is said, not hidden). Throughput is the replay's completion
tokens over its wall time; latency per request (median and worst).

Where the server runs with vLLM's `--per-request-spec-decode-metrics summary` (or `detailed`),
each answer carries its own acceptance (`metrics.speculative_decoding`): kept per request
(`per_request`: acceptance length, verify steps, accepted and drafted tokens, the histogram of
accepted drafts per step) and summed (`requests_total`), which counts this replay alone even
when the server serves others meanwhile. Without the flag both are None.

Prompts come from a JSON-lines file on the workstation (--prompts: each line `{"messages":
[...]}`, a ShareGPT-style `{"conversations": [...]}`, `{"prompt": "..."}` or a JSON string), or
from the conversation files (*.jsonl) of a folder on the host (--data). Every replay is kept
(serving-metrics.jsonl, as a `bench` scrape) under its server and the weight version the
server itself reports (`/weight_info`; for `default`, the drafter it started with from
`/server_info`): a row of the comparison table. Where this workstation's records name another
drafter, the replay says so.

Every answer is parsed into a typed record before use: a reply of the wrong shape is one line
naming the URL and the field.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from console.checkpoints.answers import Answer, parse_answer, parse_model_id
from console.checkpoints.journal import BenchRun, Figures, SpecCounts, record
from console.checkpoints.live import serving_now
from console.errors import ConsoleError
from console.hosts.host import Host
from console.logs.metrics_service import scrape
from console.logs.vllm_metrics import Snapshot, interval
from console.settings.metrics_url import split_url
from console.transport.http_client import call

#: how long the counters may lag the last answer (vLLM records stats after it sends outputs)
SETTLE_S = 10.0
async def _one(host: Host, url: str, model: str, messages: list[dict[str, str]],
               max_tokens: int, fixed_length: bool) -> tuple[float, Answer]:
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": max_tokens,
                            "temperature": 0, "return_token_ids": True}
    if fixed_length:
        body["ignore_eos"] = True
    t0 = time.monotonic()
    where = url + "/v1/chat/completions"
    doc = await call(host.transport, where, "POST", body, timeout=3600)
    return time.monotonic() - t0, parse_answer(doc, f"{host.name}: POST {where}")


def requests_total(specs: list[SpecCounts | None]) -> SpecCounts | None:
    """The per-request figures summed over the replay (None unless every answer had them)."""
    if not specs or any(s is None for s in specs):
        return None
    drafts = sum(s.drafts for s in specs if s)
    accepted = sum(s.accepted for s in specs if s)
    return SpecCounts(1 + accepted / drafts if drafts else None, drafts, accepted,
                      sum(s.draft_tokens for s in specs if s))


async def _settled(host: Host, metrics: str, before: Snapshot, tokens: int) -> Snapshot:
    """The scrape after the replay, once the generation counter has grown by its tokens."""
    ep = split_url(metrics)
    deadline = time.monotonic() + SETTLE_S
    while True:
        after = await scrape(host.transport, ep)
        grown = (after.generation_tokens or 0) - (before.generation_tokens or 0)
        if grown >= tokens or time.monotonic() > deadline:
            return after
        await asyncio.sleep(0.2)


async def replay(host: Host, prompts: list[list[dict[str, str]]], *, url: str | None = None,
                 max_tokens: int = 64, concurrency: int = 1,
                 fixed_length: bool = False) -> Replay:
    """Replay the prompts on the host's server; the figures of exactly that replay. Replies
    stop at EOS (or max_tokens); fixed_length: max_tokens each, past EOS."""
    if not prompts or max_tokens < 1 or concurrency < 1:
        raise ConsoleError("bench: needs prompts, --max-tokens >= 1 and --concurrency >= 1")
    await host.connect()
    # the drafter as the server names it (console/checkpoints/live.py), not as records say
    session, serving = await serving_now(host, url)
    base = serving.url
    model = parse_model_id(await call(host.transport, base + "/v1/models"),
                           f"{host.name}: GET {base}/v1/models")
    metrics = base + "/metrics"
    before = await scrape(host.transport, split_url(metrics))
    gate = asyncio.Semaphore(concurrency)

    async def one(msgs: list[dict[str, str]]) -> tuple[float, Answer]:
        async with gate:
            return await _one(host, base, model, msgs, max_tokens, fixed_length)

    t0 = time.monotonic()
    timed = await asyncio.gather(*(one(m) for m in prompts))
    wall = time.monotonic() - t0
    answers = [a for _, a in timed]
    tokens = sum(a.completion_tokens for a in answers)
    after = await _settled(host, metrics, before, tokens)
    fig = interval(before, after)
    grown = (after.generation_tokens or 0) - (before.generation_tokens or 0)
    lat = sorted(t for t, _ in timed)
    specs = [a.spec for a in answers]
    per_s = tokens / wall if wall > 0 else None
    run = BenchRun(run_id=session.run_id if session else None, host=host.name, url=metrics,
                   t=round(time.time(), 3), drafter=serving.name,
                   weight_version=serving.version, records_disagree=serving.disagrees,
                   prompts=len(prompts), max_tokens=max_tokens,
                   stop="fixed" if fixed_length else "eos", concurrency=concurrency,
                   completion_tokens=tokens, seconds=round(wall, 3),
                   generation_tokens_per_s=per_s, latency_median=statistics.median(lat),
                   latency_max=lat[-1],
                   total=Figures(**{**asdict(fig), "seconds": round(wall, 3),
                                    "generation_tokens_per_s": per_s}),
                   other_traffic=grown != tokens, requests_total=requests_total(specs))
    if session is not None:   # compare lists it under the serving session it measured
        record(run)
    return Replay(run, specs if any(specs) else None, answers)


@dataclass(frozen=True)
class Replay:
    """A replay's figures (the record `compare` lists), and for --json each answer's own
    acceptance (None without vLLM's per-request metrics), its reply and its prompt's ids."""

    run: BenchRun
    per_request: list[SpecCounts | None] | None
    answers: list[Answer]

    def to_json(self) -> dict[str, Any]:
        return {**self.run.to_json(),
                "per_request": None if self.per_request is None else
                [s.to_json() if s else None for s in self.per_request],
                "replies": [list(a.token_ids) if a.token_ids is not None else a.text
                            for a in self.answers],
                "prompt_token_ids": [None if a.prompt_token_ids is None
                                     else list(a.prompt_token_ids) for a in self.answers]}
