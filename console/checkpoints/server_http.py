"""JSON requests to a vLLM server on a host, through the host's own connection.

Like /metrics (console/logs/metrics_service.py), the request travels over `Transport.open_tcp`
(a direct-tcpip channel of the host's SSH connection; a loopback connection for `local`): the
server listens on the host's loopback, no port is opened anywhere. One HTTP/1.1 request with
`Connection: close`, the answer read to its end and parsed as JSON; a non-200 answer is a
ServerError carrying vLLM's own message (its `error` or `detail`), so a refused swap says why.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from console.errors import ConsoleError, TransportError
from console.logs.metrics_service import MAX_RESPONSE, response_body
from console.settings.metrics_url import split_url
from console.transport.base import Transport


class ServerError(ConsoleError):
    """The server did not answer the request as asked: one line with host, method, URL, why."""

    def __init__(self, host: str, what: str, why: str, status: int | None = None) -> None:
        super().__init__(f"{host}: {what}: {why}")
        self.why, self.status = why, status


def request_bytes(method: str, host: str, port: int, path: str, body: bytes | None) -> bytes:
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "User-Agent: eagle3-console",
            "Accept: application/json", "Accept-Encoding: identity", "Connection: close"]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + (body or b"")


def _status_and_message(raw: bytes) -> tuple[int | None, str]:
    """A failed answer's status code and the server's own message (its JSON `error`, `detail`
    or `message`, else the body's first line)."""
    head, _, body = raw.partition(b"\r\n\r\n")
    parts = head.split(b" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    text = body.decode("utf-8", errors="replace").strip()
    try:
        doc = json.loads(text[text.find("{"):]) if "{" in text else None
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        for key in ("error", "detail", "message"):
            v = doc.get(key)
            if isinstance(v, dict):
                v = v.get("message")
            if v:
                return status, str(v)[:500]
    return status, (text.splitlines() or [f"HTTP {status}"])[0][:500]


async def call(transport: Transport, url: str, method: str = "GET", body: Any = None,
               timeout: float = 60.0) -> Any:
    """The JSON answer of `method url` (with `body` as JSON); ServerError otherwise."""
    ep = split_url(url)
    what = f"{method} {url}"
    data = None if body is None else json.dumps(body).encode("utf-8")

    async def go() -> bytes:
        async with await transport.open_tcp(ep.host, ep.port) as stream:
            await stream.write(request_bytes(method, ep.host, ep.port, ep.path, data))
            raw = bytearray()
            while chunk := await stream.read():
                raw += chunk
                if len(raw) > MAX_RESPONSE:
                    raise ValueError(f"answer larger than {MAX_RESPONSE >> 20} MiB")
            return bytes(raw)

    try:
        raw = await asyncio.wait_for(go(), timeout)
    except asyncio.TimeoutError as e:
        raise ServerError(transport.name, what, f"no answer within {timeout:g} s") from e
    except TransportError as e:
        raise ServerError(transport.name, what,
                          str(e).removeprefix(f"{transport.name}: ")) from e
    except (ValueError, OSError, EOFError) as e:
        raise ServerError(transport.name, what, str(e)) from e
    try:
        text = response_body(raw)
    except ValueError:
        status, why = _status_and_message(raw)
        raise ServerError(transport.name, what, why, status) from None
    try:
        return json.loads(text) if text.strip() else None
    except ValueError as e:
        raise ServerError(transport.name, what, f"not JSON ({e})") from e
