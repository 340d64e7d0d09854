"""JSON requests to a vLLM server on a host, through the host's own connection.

Like /metrics (console/logs/metrics_service.py), the request travels over `Transport.open_tcp`
(a direct-tcpip channel of the host's SSH connection; a loopback connection for `local`): the
server listens on the host's loopback, no port is opened anywhere. One HTTP/1.1 request with
`Connection: close`, the answer read to its end and parsed as JSON.

A failure is a ServerError that says what is known of the request's fate, because a weight
update that failed half-way must not be worded as one that never happened:

    unreachable  no connection: the request never reached the server
    refused      a whole answer with an error status: the server said no (its own message)
    no answer    sent, and the connection closed (or the deadline passed) with nothing back
    cut          sent, and the answer stopped part-way
    garbled      sent, and what came back is not an HTTP answer, or not JSON, or too large

Only `unreachable` and `refused` tell what the server did. A cut or garbled answer is described,
never quoted: the bytes of half an answer are not a message.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from console.errors import ConsoleError, TransportError
from console.logs.metrics_service import MAX_RESPONSE, excerpt, response_body
from console.settings.metrics_url import split_url
from console.transport.base import Transport

UNREACHABLE, REFUSED, NO_ANSWER, CUT, GARBLED = \
    "unreachable", "refused", "no answer", "cut", "garbled"


class ServerError(ConsoleError):
    """The server did not answer the request as asked: one line with host, method, URL, why;
    `kind` says what is known of the request's fate (module docstring)."""

    def __init__(self, host: str, what: str, why: str, status: int | None = None,
                 kind: str = REFUSED) -> None:
        super().__init__(f"{host}: {what}: {why}")
        self.why, self.status, self.kind = why, status, kind

    @property
    def known(self) -> bool:
        """True when the server is known to have not done what was asked (never reached, or
        it said no); False when it may have done it."""
        return self.kind in (UNREACHABLE, REFUSED)


def request_bytes(method: str, host: str, port: int, path: str, body: bytes | None) -> bytes:
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "User-Agent: eagle3-console",
            "Accept: application/json", "Accept-Encoding: identity", "Connection: close"]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + (body or b"")


def _head(raw: bytes) -> tuple[int | None, dict[str, str], bytes] | None:
    """A complete answer's status, headers and body as sent (None when the head is not
    HTTP/1.x with a numeric status, or not complete)."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if not sep or len(parts) < 2 or not parts[0].startswith("HTTP/1.") \
            or not (parts[1].isdigit() and len(parts[1]) == 3):
        return None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers, body


def classify(raw: bytes) -> tuple[str, int | None, str]:
    """Why an answer that is not a 200 with a whole body failed: (kind, status, why); a refusal
    carries the server's own message (its JSON `error`, `detail` or `message`, else its
    first line), anything else only a description."""
    if not raw:
        return NO_ANSWER, None, "the connection closed with no answer"
    parsed = _head(raw)
    if parsed is None:
        if raw.startswith(b"HTTP/") and b"\r\n\r\n" not in raw:
            return CUT, None, f"the answer was cut short in its head ({len(raw)} bytes)"
        return GARBLED, None, "not an HTTP answer (bad status line)"
    status, headers, body = parsed
    try:
        length = int(headers.get("content-length", ""))
    except ValueError:
        length = None
    cut = length is not None and len(body) < length
    if status == 200:
        if cut or "chunked" in headers.get("transfer-encoding", "").lower():
            return CUT, status, "the answer (HTTP 200) was cut short" + \
                (f": {len(body)} of {length} bytes" if cut else "")
        return GARBLED, status, "an answer (HTTP 200) whose body cannot be read"
    if cut:   # the status says no; its message did not all come
        return REFUSED, status, f"HTTP {status} (its message cut short)"
    text = body.decode("utf-8", errors="replace").strip()
    try:
        doc = json.loads(text) if text.startswith("{") else None
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        for key in ("error", "detail", "message"):
            v = doc.get(key)
            if isinstance(v, dict):
                v = v.get("message")
            if isinstance(v, str) and v.strip():
                return REFUSED, status, f"HTTP {status}: {excerpt(v.strip(), 300)}"
    first = text.splitlines()[0] if text and doc is None and not text.startswith("{") else ""
    return REFUSED, status, f"HTTP {status}" + (f": {excerpt(first, 300)}" if first else "")


async def call(transport: Transport, url: str, method: str = "GET", body: Any = None,
               timeout: float = 60.0) -> Any:
    """The JSON answer of `method url` (with `body` as JSON); ServerError otherwise."""
    ep = split_url(url)
    what = f"{method} {url}"
    data = None if body is None else json.dumps(body).encode("utf-8")
    sent = False
    raw = bytearray()

    async def go() -> None:
        nonlocal sent
        async with await transport.open_tcp(ep.host, ep.port) as stream:
            sent = True   # from here on the server may act on the request
            await stream.write(request_bytes(method, ep.host, ep.port, ep.path, data))
            while chunk := await stream.read():
                raw.extend(chunk)
                if len(raw) > MAX_RESPONSE:
                    raise ServerError(transport.name, what, f"answer larger than "
                                      f"{MAX_RESPONSE >> 20} MiB", None, GARBLED)

    try:
        await asyncio.wait_for(go(), timeout)
    except ServerError:
        raise
    except asyncio.TimeoutError as e:
        got = f" ({len(raw)} bytes of an answer)" if raw else ""
        raise ServerError(transport.name, what, f"no answer within {timeout:g} s{got}", None,
                          CUT if raw else NO_ANSWER) from e
    except (TransportError, OSError, EOFError) as e:
        why = str(e).removeprefix(f"{transport.name}: ")
        if not sent:
            raise ServerError(transport.name, what, why, None, UNREACHABLE) from e
        raise ServerError(transport.name, what, f"the connection broke ({why})"
                          + (f" after {len(raw)} bytes of an answer" if raw else ""),
                          None, CUT if raw else NO_ANSWER) from e
    try:
        text = response_body(bytes(raw))
    except ValueError:
        kind, status, why = classify(bytes(raw))
        raise ServerError(transport.name, what, why, status, kind) from None
    try:
        return json.loads(text) if text.strip() else None
    except ValueError:
        raise ServerError(transport.name, what, "an answer (HTTP 200) that is not JSON", 200,
                          GARBLED) from None
