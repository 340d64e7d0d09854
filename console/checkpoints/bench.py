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
import json
import math
import os
import posixpath
import stat as stat_mod
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from console.checkpoints.compare import record_scrape
from console.checkpoints.live import serving_now
from console.errors import ConsoleError, TransportError
from console.hosts.host import Host
from console.logs.metrics_service import scrape
from console.logs.vllm_metrics import Snapshot, interval
from console.settings.metrics_url import split_url
from console.transport.http_client import call
from console.transport.small_files import json_why

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
         "system": "system", "model": "assistant"}
#: how long the counters may lag the last answer (vLLM records stats after it sends outputs)
SETTLE_S = 10.0
#: prompt files are read up to here in all (a data folder may hold far more than a bench
#: replays), and one line up to LINE_LIMIT
READ_LIMIT = 256 << 20
LINE_LIMIT = 16 << 20
CHUNK = 4 << 20


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


def parse_prompts(lines: str | Iterable[str], name: str, n: int | None = None
                  ) -> list[list[dict[str, str]]]:
    """The conversations of JSON lines (a text, or its lines), the first `n` at most."""
    out: list[list[dict[str, str]]] = []
    for i, line in enumerate(lines.splitlines() if isinstance(lines, str) else lines, 1):
        if n is not None and len(out) >= n:
            break
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise ConsoleError(f"{name}:{i}: not JSON ({json_why(e)})") from None
        out.append(prompt_of(doc, f"{name}:{i}"))
    return out


def read_prompts_file(path: str, n: int | None = None) -> list[list[dict[str, str]]]:
    """The conversations of a JSON-lines file here (a regular file; read line by line, within
    READ_LIMIT, until `n` are found)."""
    try:
        if not stat_mod.S_ISREG(os.stat(path).st_mode):
            raise ConsoleError(f"--prompts {path}: not a regular file")
        with open(path, encoding="utf-8") as f:
            return parse_prompts(_bounded_lines(f, path), path, n)
    except (OSError, UnicodeDecodeError) as e:
        raise ConsoleError(f"--prompts {path}: cannot read ({e})") from None


def _bounded_lines(f: Any, name: str) -> Iterable[str]:
    total = 0
    while line := f.readline(LINE_LIMIT + 1):
        total += len(line)
        if len(line) > LINE_LIMIT:
            raise ConsoleError(f"{name}: a line longer than {LINE_LIMIT >> 20} MiB")
        if total > READ_LIMIT:
            raise ConsoleError(f"{name}: more than {READ_LIMIT >> 20} MiB read; give -n or a "
                               "smaller file")
        yield line


async def _host_lines(host: Host, path: str, budget: int) -> list[str]:
    """A regular file of the host as lines, read in chunks; ConsoleError past `budget` bytes."""
    st = await host.transport.stat(path)
    if st is None or not stat_mod.S_ISREG(st.mode):
        raise ConsoleError(f"{host.name}:{path}: not a regular file")
    if st.size > budget:
        raise ConsoleError(f"{host.name}:{path}: more than {READ_LIMIT >> 20} MiB to read; give "
                           "-n or a folder of fewer conversations")
    data = bytearray()
    while chunk := await host.transport.read_range(path, len(data), CHUNK):
        data += chunk
        if len(data) > budget:
            raise ConsoleError(f"{host.name}:{path}: more than {READ_LIMIT >> 20} MiB to read")
    text = data.decode("utf-8", errors="replace")
    return text.splitlines()


async def read_prompts_dir(host: Host, folder: str, n: int | None = None
                           ) -> list[list[dict[str, str]]]:
    """The conversations of every *.jsonl file in a folder on the host, file by file in name
    order, until `n` are found (regular files only, READ_LIMIT bytes in all)."""
    folder = await host.resolve(folder)
    res = await host.transport.run(["ls", "-1", "--", folder], check=False)
    if res.returncode != 0:
        raise ConsoleError(f"{host.name}:{folder}: cannot list ({res.stderr.strip()[:200]})")
    out: list[list[dict[str, str]]] = []
    budget = READ_LIMIT
    for name in sorted(n for n in res.stdout.splitlines() if n.endswith(".jsonl")):
        if n is not None and len(out) >= n:
            break
        path = posixpath.join(folder, name)
        try:
            lines = await _host_lines(host, path, budget)
        except TransportError as e:
            raise ConsoleError(f"{host.name}:{path}: cannot read ({e})") from None
        budget -= sum(len(x) + 1 for x in lines)
        out += parse_prompts(lines, f"{host.name}:{path}",
                             None if n is None else n - len(out))
    if not out:
        raise ConsoleError(f"{host.name}:{folder}: no conversations in *.jsonl files")
    return out


# -- the server's answers, typed -------------------------------------------------------------

@dataclass(frozen=True)
class Answer:
    """One chat completion as the replay uses it."""

    completion_tokens: int
    text: str | None
    token_ids: list[int] | None
    prompt_token_ids: list[int] | None
    finish_reason: str | None
    spec: dict[str, Any] | None      # per_request(): vLLM's per-request acceptance


class BadAnswer(ConsoleError):
    """A server's answer of the wrong shape: one line naming the request and the field."""

    def __init__(self, what: str, field: str, got: Any, want: str) -> None:
        super().__init__(f"{what}: `{field}` is {_kind(got)}, not {want}")


def _kind(v: Any) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(v), f"the number {v!r}" if isinstance(v, (int, float))
                                     else type(v).__name__)


def _ids(v: Any) -> list[int] | None:
    if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return list(v)
    return None


def parse_answer(doc: Any, what: str) -> Answer:
    """A /v1/chat/completions answer (BadAnswer naming the field that is not vLLM's shape)."""
    if not isinstance(doc, dict):
        raise BadAnswer(what, "answer", doc, "an object")
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise BadAnswer(what, "choices", choices, "a list of objects")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise BadAnswer(what, "choices[0].message", message, "an object")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise BadAnswer(what, "choices[0].message.content", content, "a string")
    usage = doc.get("usage")
    if not isinstance(usage, dict):
        raise BadAnswer(what, "usage", usage, "an object")
    tokens = usage.get("completion_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        raise BadAnswer(what, "usage.completion_tokens", tokens, "a count")
    metrics = doc.get("metrics")
    reason = choice.get("finish_reason")
    return Answer(completion_tokens=tokens, text=content,
                  token_ids=_ids(choice.get("token_ids")),
                  prompt_token_ids=_ids(doc.get("prompt_token_ids")),
                  finish_reason=reason if isinstance(reason, str) else None,
                  spec=per_request(metrics.get("speculative_decoding")
                                   if isinstance(metrics, dict) else None))


def parse_model_id(doc: Any, what: str) -> str:
    """The first model /v1/models lists."""
    if not isinstance(doc, dict):
        raise BadAnswer(what, "answer", doc, "an object")
    data = doc.get("data")
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        raise BadAnswer(what, "data", data, "a list of models")
    mid = data[0].get("id")
    if not isinstance(mid, str) or not mid:
        raise BadAnswer(what, "data[0].id", mid, "a model name")
    return mid


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


def per_request(spec: Any) -> dict[str, Any] | None:
    """One answer's `metrics.speculative_decoding` (vLLM's --per-request-spec-decode-metrics)
    as figures: None when the server does not send it or it is not what vLLM 0.32 writes."""
    if not isinstance(spec, dict):
        return None
    try:
        steps, accepted = int(spec["num_spec_steps"]), int(spec["num_accepted_draft_tokens"])
        drafted = int(spec["num_draft_tokens"])
        hist = [int(x) for x in spec.get("acceptance_histogram") or []]
    except (KeyError, TypeError, ValueError, OverflowError):
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
                 max_tokens: int = 64, concurrency: int = 1,
                 fixed_length: bool = False) -> dict[str, Any]:
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
    out = {"host": host.name, "url": metrics, "run_id": session.run_id if session else None,
           "bench": True, "drafter": serving.name, "weight_version": serving.version,
           "records_disagree": serving.disagrees, "t": round(time.time(), 3),
           "prompts": len(prompts), "max_tokens": max_tokens,
           "stop": "fixed" if fixed_length else "eos", "concurrency": concurrency,
           "completion_tokens": tokens, "seconds": round(wall, 3),
           "generation_tokens_per_s": tokens / wall if wall > 0 else None,
           "latency_s": {"median": statistics.median(lat), "max": lat[-1]},
           "total": {**fig.to_dict(), "seconds": round(wall, 3),
                     "generation_tokens_per_s": tokens / wall if wall > 0 else None},
           "other_traffic": grown != tokens,
           "per_request": specs if any(specs) else None,
           "requests_total": requests_total(specs),
           "replies": [a.token_ids if a.token_ids is not None else a.text for a in answers],
           "prompt_token_ids": [a.prompt_token_ids for a in answers]}
    left_out = ("replies", "prompt_token_ids", "per_request")  # in --json only
    if session is not None:   # compare lists it under the serving session it measured
        record_scrape(session.run_id, {k: v for k, v in out.items() if k not in left_out})
    return out
