"""Regenerate assistant turns with the target through an OpenAI-compatible chat completions API.

    python -m engine regen --endpoint http://host:8000/v1 --model NAME --in prompts.jsonl \\
        --out regen.jsonl [--concurrency 16] [--max-tokens 2048]

What vLLM and SGLang serve (`POST {endpoint}/chat/completions`). Every assistant turn is replaced
by the target's own reply, turn by turn: after every user turn comes the target's reply to the
conversation so far, WITH its own earlier replies, so the drafter learns the target's
distribution. Prompt-only files (user turns only) get every reply generated the same way.

Conversations run concurrently (at most `--concurrency` requests in flight); each finished
conversation is appended to OUT as one JSON line and flushed, so a killed run loses at most the
in-flight conversations. A rerun skips ids already in OUT: an unterminated last line (a write
cut by a kill) is cut off first, and nothing else ever is; any other line that is not a
conversation with an id (blank lines aside) refuses the run, naming the line. IN and OUT must be
different files.
Each request ends within --timeout (overall, however slowly the answer trickles in) and its
answer is capped in size (engine/bounded_http.py, shared with the capture clients).
Transient failures (connection errors, timeouts, HTTP 408/409/429/5xx) are retried with
exponential backoff and jitter; other HTTP errors fail that conversation. Failed conversations are
not written: the command reports them and exits non-zero, and a rerun retries just those.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import threading
import time
import urllib.parse
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from engine.bounded_http import AnswerTooLarge, connection, error_reason, send
from engine.data.conversations import Conversation, parse_line, read_conversations
from engine.errors import EngineError
from engine.events import Emitter

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class RequestFailed(Exception):
    """A request that will not succeed by retrying (or ran out of retries)."""


def chat_url(endpoint: str) -> str:
    """Accept a server root, a `/v1` base or the full chat completions URL."""
    e = endpoint.rstrip("/")
    if not e.startswith(("http://", "https://")):
        raise EngineError(f"--endpoint {endpoint}: must start with http:// or https://")
    if e.endswith("/chat/completions"):
        return e
    return e + ("/chat/completions" if e.endswith("/v1") else "/v1/chat/completions")


@dataclass
class Client:
    """One OpenAI-compatible chat completions endpoint (thread-safe: no shared state)."""

    url: str
    model: str
    max_tokens: int = 2048
    temperature: float = 0.0
    api_key: str | None = None
    timeout: float = 600.0
    retries: int = 6
    backoff: float = 0.5

    def complete(self, messages: list[dict[str, str]]) -> str:
        body = json.dumps({"model": self.model, "messages": messages,
                           "max_tokens": self.max_tokens,
                           "temperature": self.temperature}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        u = urllib.parse.urlsplit(self.url)
        path = u.path + (f"?{u.query}" if u.query else "")
        for attempt in range(self.retries + 1):
            why = ""
            conn = connection(self.url, self.timeout)
            try:  # the whole request within --timeout, the answer capped (bounded_http.py)
                ans = send(conn, "POST", path, body, headers, self.timeout)
            except AnswerTooLarge as e:
                raise RequestFailed(f"{self.url}: {e}") from None
            except (OSError, http.client.HTTPException) as e:  # refused, reset, timed out
                why = str(e) or type(e).__name__
            else:
                if ans.status < 300:
                    try:
                        return _reply_text(json.loads(ans.body))
                    except (ValueError, RecursionError) as e:  # not the JSON we expect
                        raise RequestFailed(f"bad response from {self.url}: "
                                            f"{str(e)[:200]}") from None
                detail = error_reason(ans.body, 200)
                if ans.status not in RETRY_STATUS:
                    raise RequestFailed(f"HTTP {ans.status} from {self.url}: {detail}")
                why = f"HTTP {ans.status}"
            finally:
                conn.close()
            if attempt == self.retries:
                raise RequestFailed(f"{self.url}: giving up after {attempt + 1} attempts ({why})")
            time.sleep(min(30.0, self.backoff * 2 ** attempt) * (0.5 + random.random()))
        raise AssertionError("unreachable")


def _reply_text(obj: Any) -> str:
    try:
        content = obj["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ValueError("no choices[0].message.content") from None
    if not isinstance(content, str):
        raise ValueError("choices[0].message.content is not a string")
    return content


def regenerate(client: Client, conv: Conversation) -> Conversation:
    """The conversation with a fresh target reply after every user turn (module docstring).

    Input assistant turns are dropped: each is replaced by the target's reply to the turns before
    it, which include the target's own earlier replies. System and tool turns stay in place."""
    out: list[dict[str, str]] = []
    for t in conv.turns:
        if t["role"] == "assistant":
            continue
        out.append(dict(t))
        if t["role"] == "user":
            out.append({"role": "assistant", "content": client.complete(out)})
    return Conversation(id=conv.id, turns=out, extra=conv.extra)


def done_ids(path: str) -> set[str]:
    """Ids already in OUT (module docstring); an unterminated last line is cut off the file."""
    ids: set[str] = set()
    if not os.path.exists(path):
        return ids
    good = 0
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                break  # the last line, torn by a kill: the one thing cut off
            good += len(line)
            if line.strip():
                ids.add(_written_id(line, f"{path}:{n}"))
    if good != os.path.getsize(path):
        with open(path, "r+b") as f:
            f.truncate(good)
    return ids


def _written_id(line: bytes, where: str) -> str:
    """The id of one line of OUT, or an EngineError naming the line (never cut: it may be
    anyone's data)."""
    why = "not a line regen writes; fix or remove it (regen only ever cuts an unterminated " \
          "last line)"
    try:
        obj = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise EngineError(f"{where}: not UTF-8 text: {why}") from None
    except (ValueError, RecursionError) as e:
        raise EngineError(f"{where}: invalid JSON ({str(e)[:80]}): {why}") from None
    if not isinstance(obj, dict) or "id" not in obj:
        raise EngineError(f"{where}: no conversation id: {why}")
    try:
        parse_line(obj, where)  # a conversation, worded as the readers word it
    except EngineError as e:
        raise EngineError(f"{e}: {why}") from None
    return str(obj["id"])


def check_paths(in_path: str, out_path: str) -> None:
    """Refuse an OUT that is IN (by name, symlink or hard link): appending would rewrite IN."""
    same = os.path.realpath(in_path) == os.path.realpath(out_path)
    if not same and os.path.exists(in_path) and os.path.exists(out_path):
        same = os.path.samefile(in_path, out_path)
    if same:
        raise EngineError(f"--out {out_path}: is the --in file {in_path} (regen appends to "
                          "--out as it goes); choose another --out")


def regen(client: Client, in_path: str, out_path: str, concurrency: int, ev: Emitter
          ) -> dict[str, Any]:
    """Regenerate every conversation of IN not yet in OUT; returns counts."""
    if concurrency < 1:
        raise EngineError(f"--concurrency {concurrency}: must be >= 1")
    check_paths(in_path, out_path)
    convs = read_conversations(in_path)
    skip = done_ids(out_path)
    todo = [c for c in convs if c.id not in skip]
    total = len(convs)
    done = total - len(todo)
    failed: list[tuple[str, str]] = []
    lock = threading.Lock()
    start = time.monotonic()
    if done:
        ev.log(f"{done} of {total} conversations already in {out_path}: skipped")
    ev.progress(done, total, unit="conv", desc="regen", force=True)
    with open(out_path, "a", encoding="utf-8") as out, \
            ThreadPoolExecutor(max_workers=concurrency) as pool:
        pending: dict[Future[Conversation], Conversation] = {}
        queue = iter(todo)
        try:
            while True:
                while len(pending) < concurrency * 2:  # bounded queue: memory stays flat
                    c = next(queue, None)
                    if c is None:
                        break
                    pending[pool.submit(regenerate, client, c)] = c
                if not pending:
                    break
                finished, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                for fut in finished:
                    conv = pending.pop(fut)
                    try:
                        result = fut.result()
                    except RequestFailed as e:
                        failed.append((conv.id, str(e)))
                        ev.log(f"conversation {conv.id!r}: {e}", level="warning")
                        continue
                    with lock:
                        out.write(result.to_json() + "\n")
                        out.flush()
                    done += 1
                    ev.progress(done, total, unit="conv", desc="regen")
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise
    summary = {"total": total, "written": done - (total - len(todo)), "skipped": total - len(todo),
               "failed": len(failed), "seconds": round(time.monotonic() - start, 2),
               "out": out_path}
    if failed:
        ev.log(f"{len(failed)} conversations failed; {done} of {total} are in {out_path}",
               level="warning")
        first_id, why = failed[0]
        raise EngineError(f"{len(failed)} of {total} conversations failed (first: {first_id!r}: "
                          f"{why}); rerun the same command to retry them")
    return summary
