"""Replay the same prompts against a served drafter, and measure exactly that replay (the `bench`
command's service).

Each prompt is a conversation cut before its first assistant turn, sent to the server's
`/v1/chat/completions` through the host's own connection (console/checkpoints/server_http.py):
vLLM applies the target's own chat template, greedy (temperature 0), fixed length (max_tokens M
with ignore_eos), at most C requests at once. Acceptance comes from the server's /metrics
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
(serving-metrics.jsonl, as a `bench` scrape) under its server and weight version: a row of the
comparison table.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import statistics
import time
from pathlib import Path
from typing import Any

from console.checkpoints.compare import record_scrape
from console.checkpoints.server_http import call
from console.checkpoints.swap import base_url, find_session, now_serving
from console.errors import ConsoleError
from console.hosts.host import Host
from console.logs.metrics_service import scrape
from console.logs.vllm_metrics import Snapshot, interval
from console.settings.metrics_url import split_url

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
         "system": "system", "model": "assistant"}
#: how long the counters may lag the last answer (vLLM records stats after it sends outputs)
SETTLE_S = 10.0


def prompt_of(doc: Any, where: str) -> list[dict[str, str]]:
    """One conversation up to its first assistant turn (ConsoleError naming `where`)."""
    if isinstance(doc, str):
        return [{"role": "user", "content": doc}]
    if isinstance(doc, dict) and isinstance(doc.get("prompt"), str):
        return [{"role": "user", "content": doc["prompt"]}]
    turns = None
    if isinstance(doc, dict):
        turns = next((doc[k] for k in ("messages", "conversations", "conversation")
                      if isinstance(doc.get(k), list)), None)
    if turns is None:
        raise ConsoleError(f"{where}: expected messages, conversations, prompt or a string")
    out: list[dict[str, str]] = []
    for t in turns:
        if not isinstance(t, dict):
            raise ConsoleError(f"{where}: a turn is not an object")
        role = ROLES.get(str(t.get("role", t.get("from", ""))).lower())
        text = t.get("content", t.get("value"))
        if role is None or not isinstance(text, str):
            raise ConsoleError(f"{where}: a turn without role/from and content/value")
        if role == "assistant":
            break
        out.append({"role": role, "content": text})
    if not any(m["role"] == "user" for m in out):
        raise ConsoleError(f"{where}: no user turn before the first assistant turn")
    return out


def parse_prompts(text: str, name: str) -> list[list[dict[str, str]]]:
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError as e:
            raise ConsoleError(f"{name}:{i}: not JSON ({e})") from None
        out.append(prompt_of(doc, f"{name}:{i}"))
    return out


def read_prompts_file(path: str) -> list[list[dict[str, str]]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConsoleError(f"--prompts {path}: cannot read ({e})") from None
    return parse_prompts(text, path)


async def read_prompts_dir(host: Host, folder: str) -> list[list[dict[str, str]]]:
    """The conversations of every *.jsonl file in a folder on the host, file by file in name
    order."""
    folder = await host.resolve(folder)
    res = await host.transport.run(["ls", "-1", "--", folder], check=False)
    if res.returncode != 0:
        raise ConsoleError(f"{host.name}:{folder}: cannot list ({res.stderr.strip()[:200]})")
    out: list[list[dict[str, str]]] = []
    for name in sorted(n for n in res.stdout.splitlines() if n.endswith(".jsonl")):
        path = posixpath.join(folder, name)
        data = await host.transport.run(["cat", "--", path], check=False)
        if data.returncode != 0:
            raise ConsoleError(f"{host.name}:{path}: cannot read")
        out += parse_prompts(data.stdout, f"{host.name}:{path}")
    if not out:
        raise ConsoleError(f"{host.name}:{folder}: no conversations in *.jsonl files")
    return out


async def _one(host: Host, url: str, model: str, messages: list[dict[str, str]],
               max_tokens: int) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    t0 = time.monotonic()
    doc = await call(host.transport, url + "/v1/chat/completions", "POST", body, timeout=3600)
    choice = (doc.get("choices") or [{}])[0] if isinstance(doc, dict) else {}
    usage = doc.get("usage") or {} if isinstance(doc, dict) else {}
    metrics = doc.get("metrics") if isinstance(doc, dict) else None
    return {"seconds": time.monotonic() - t0,
            "spec": per_request(metrics.get("speculative_decoding")
                                if isinstance(metrics, dict) else None),
            "text": (choice.get("message") or {}).get("content"),
            "token_ids": choice.get("token_ids"),
            "prompt_token_ids": doc.get("prompt_token_ids") if isinstance(doc, dict) else None,
            "completion_tokens": int(usage.get("completion_tokens") or 0)}


def per_request(spec: Any) -> dict[str, Any] | None:
    """One answer's `metrics.speculative_decoding` (vLLM's --per-request-spec-decode-metrics)
    as figures: None when the server does not send it or it is not what vLLM 0.32 writes."""
    if not isinstance(spec, dict):
        return None
    try:
        steps, accepted = int(spec["num_spec_steps"]), int(spec["num_accepted_draft_tokens"])
        drafted = int(spec["num_draft_tokens"])
        hist = [int(x) for x in spec.get("acceptance_histogram") or []]
    except (KeyError, TypeError, ValueError):
        return None
    return {"acceptance_length": 1 + accepted / steps if steps else None, "drafts": steps,
            "accepted": accepted, "draft_tokens": drafted, "histogram": hist}


def requests_total(specs: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The per-request figures summed over the replay (None unless every answer had them)."""
    if not specs or any(s is None for s in specs):
        return None
    drafts = sum(s["drafts"] for s in specs if s)
    accepted = sum(s["accepted"] for s in specs if s)
    return {"acceptance_length": 1 + accepted / drafts if drafts else None, "drafts": drafts,
            "accepted": accepted, "draft_tokens": sum(s["draft_tokens"] for s in specs if s)}


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
                 max_tokens: int = 64, concurrency: int = 1) -> dict[str, Any]:
    """Replay the prompts on the host's server; the figures of exactly that replay."""
    if not prompts or max_tokens < 1 or concurrency < 1:
        raise ConsoleError("bench: needs prompts, --max-tokens >= 1 and --concurrency >= 1")
    await host.connect()
    session = find_session(host.name, url)
    base = url.rstrip("/") if url else base_url(session)
    models = await call(host.transport, base + "/v1/models")
    model = str(((models or {}).get("data") or [{}])[0].get("id"))
    version = (await call(host.transport, base + "/weight_info") or {}).get("weight_version") \
        if session.get("swappable") else None
    metrics = base + "/metrics"
    before = await scrape(host.transport, split_url(metrics))
    gate = asyncio.Semaphore(concurrency)

    async def one(msgs: list[dict[str, str]]) -> dict[str, Any]:
        async with gate:
            return await _one(host, base, model, msgs, max_tokens)

    t0 = time.monotonic()
    answers = await asyncio.gather(*(one(m) for m in prompts))
    wall = time.monotonic() - t0
    tokens = sum(a["completion_tokens"] for a in answers)
    after = await _settled(host, metrics, before, tokens)
    fig = interval(before, after)
    grown = (after.generation_tokens or 0) - (before.generation_tokens or 0)
    lat = sorted(a["seconds"] for a in answers)
    drafter, _ = now_serving(session)
    out = {"host": host.name, "url": metrics, "run_id": session.get("run_id"), "bench": True,
           "drafter": drafter, "weight_version": version, "t": round(time.time(), 3),
           "prompts": len(prompts), "max_tokens": max_tokens, "concurrency": concurrency,
           "completion_tokens": tokens, "seconds": round(wall, 3),
           "generation_tokens_per_s": tokens / wall if wall > 0 else None,
           "latency_s": {"median": statistics.median(lat), "max": lat[-1]},
           "total": {**fig.to_dict(), "seconds": round(wall, 3),
                     "generation_tokens_per_s": tokens / wall if wall > 0 else None},
           "other_traffic": grown != tokens,
           "per_request": [a["spec"] for a in answers] if any(a["spec"] for a in answers)
           else None,
           "requests_total": requests_total([a["spec"] for a in answers]),
           "replies": [a["token_ids"] if a["token_ids"] is not None else a["text"]
                       for a in answers],
           "prompt_token_ids": [a["prompt_token_ids"] for a in answers]}
    left_out = ("replies", "prompt_token_ids", "per_request")  # in --json only
    record_scrape(str(session.get("run_id")), {k: v for k, v in out.items() if k not in left_out})
    return out
