"""Fetching a vLLM server's /metrics through the host's own connection.

The server listens on the GPU host (usually its loopback only). The request goes through
`Transport.open_tcp`: a direct-tcpip channel of the host's SSH connection (a plain loopback
connection for the `local` host), so no port is opened anywhere and no HTTP crosses the network
outside SSH. The request is a minimal HTTP/1.1 GET with `Connection: close`; the answer is read
to its end (bounded), de-chunked and, if the server insists, gunzipped. The figures come from
console/logs/vllm_metrics.py (pure).

Both bounds are MAX_RESPONSE: the bytes read and the bytes a compressed body inflates to (a
130 KB gzip bomb inflates to 128 MiB; it is stopped at the cap, never held whole). Inflating and
parsing a page run in a worker thread, off the event loop the TUI draws from; an error quotes
at most EXCERPT characters of what the server sent.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from typing import TYPE_CHECKING

from console.errors import ConsoleError, TransportError
from console.logs.vllm_metrics import Report, Series, Snapshot, parse_snapshot
from console.settings.metrics_url import Endpoint, split_url
from console.transport.base import Transport

if TYPE_CHECKING:
    from console.hosts.host import Host

FETCH_TIMEOUT = 5.0
#: a vLLM page is 50-200 KB (histogram buckets per model); anything this big is not one
MAX_RESPONSE = 32 << 20
EXCERPT = 160       # characters of a server's text an error quotes
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class MetricsError(ConsoleError):
    """The endpoint did not give a metrics page: one line naming host and URL, and why."""

    def __init__(self, host: str, url: str, why: str) -> None:
        super().__init__(f"{host}: cannot read {url}: {why}")
        self.host, self.url, self.why = host, url, why


def request_bytes(ep: Endpoint) -> bytes:
    host = ep.host if ":" not in ep.host else f"[{ep.host}]"
    return (f"GET {ep.path} HTTP/1.1\r\nHost: {host}:{ep.port}\r\n"
            "User-Agent: eagle3-console\r\nAccept: text/plain\r\n"
            "Accept-Encoding: identity\r\nConnection: close\r\n\r\n").encode("ascii")


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    i = 0
    while True:
        end = data.find(b"\r\n", i)
        if end < 0:
            raise ValueError("truncated chunked body")
        size = int(data[i:end].split(b";")[0].strip() or b"x", 16)
        if size == 0:
            return bytes(out)
        start = end + 2
        if start + size > len(data):
            raise ValueError("truncated chunked body")
        out += data[start:start + size]
        i = start + size + 2


def response_body(raw: bytes) -> bytes:
    """The body of a complete HTTP/1.x response (read until the server closed).
    ValueError for anything but a 200 with a whole body."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        if not raw:
            raise ValueError("the server closed the connection without an answer")
        raise ValueError("not an HTTP response" if not raw.startswith(b"HTTP/")
                         else "truncated HTTP response")
    lines = head.decode("latin-1").split("\r\n")
    status = lines[0].split(" ", 2)
    if len(status) < 2 or not status[0].startswith("HTTP/1."):
        raise ValueError("not an HTTP response")
    if status[1] != "200":
        raise ValueError(f"HTTP {' '.join(status[1:])}")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip().lower()
    if "chunked" in headers.get("transfer-encoding", ""):
        body = _dechunk(body)
    elif "content-length" in headers:
        n = int(headers["content-length"])
        if len(body) < n:
            raise ValueError(f"truncated body ({len(body)} of {n} bytes)")
        body = body[:n]
    encoding = headers.get("content-encoding", "identity")
    if encoding in _WBITS:
        return inflate(body, _WBITS[encoding])
    if encoding != "identity":
        raise ValueError(f"unsupported content encoding {excerpt(encoding)!r}")
    return body


def inflate(data: bytes, wbits: int, limit: int = MAX_RESPONSE) -> bytes:
    """A gzip / zlib body inflated to at most `limit` bytes: ValueError past it (the output is
    made in one bounded call: zlib stops at max_length and keeps the rest of the input)."""
    d = zlib.decompressobj(wbits)
    out = d.decompress(data, limit + 1)
    if len(out) > limit or d.unconsumed_tail:
        raise ValueError(f"compressed answer inflates past {limit >> 20} MiB")
    if not d.eof:
        raise ValueError("truncated compressed body")
    return out


def excerpt(text: str, room: int = EXCERPT) -> str:
    """The start of a server's text for an error line: its first line, at most `room`
    characters, the length of what was left out said."""
    first = text.split("\n", 1)[0]
    if len(first) <= room and len(first) == len(text):
        return text
    return first[:room] + f"… ({len(text) - min(len(first), room)} more characters)"


async def fetch(transport: Transport, ep: Endpoint, timeout: float = FETCH_TIMEOUT) -> str:
    """The page at ep, fetched from the host's side. MetricsError (never another error) when
    the host, the port or the answer fails."""

    async def get() -> bytes:
        async with await transport.open_tcp(ep.host, ep.port) as stream:
            await stream.write(request_bytes(ep))
            raw = bytearray()
            while chunk := await stream.read():
                raw += chunk
                if len(raw) > MAX_RESPONSE:
                    raise ValueError(f"answer larger than {MAX_RESPONSE >> 20} MiB")
            return bytes(raw)

    def page(raw: bytes) -> str:
        return response_body(raw).decode("utf-8", errors="replace")

    try:
        raw = await asyncio.wait_for(get(), timeout)
        return await asyncio.to_thread(page, raw)   # inflating 32 MiB is not for the loop
    except asyncio.TimeoutError as e:
        raise MetricsError(transport.name, ep.url, f"no answer within {timeout:g} s") from e
    except TransportError as e:
        # the transport's message starts with the host name: keep only its reason
        why = str(e).removeprefix(f"{transport.name}: ")
        raise MetricsError(transport.name, ep.url, why) from e
    except (ValueError, OSError, EOFError, zlib.error) as e:
        raise MetricsError(transport.name, ep.url, excerpt(str(e))) from e


async def scrape(transport: Transport, ep: Endpoint, timeout: float = FETCH_TIMEOUT) -> Snapshot:
    """Fetch and parse one page, stamped with the time it was asked for."""
    t, clock = time.time(), time.monotonic()
    text = await fetch(transport, ep, timeout)
    try:
        return await asyncio.to_thread(parse_snapshot, text, t, clock)
    except ValueError as e:
        raise MetricsError(transport.name, ep.url, f"not a metrics page: {excerpt(str(e))}") \
            from e


async def scrape_host(host: Host, url: str, timeout: float = FETCH_TIMEOUT) -> Snapshot:
    """One page of the endpoint at `url`, fetched through the host's own connection."""
    await host.connect()
    return await scrape(host.transport, split_url(url), timeout)


class MetricsWatch:
    """One endpoint scraped again and again: each scrape's Report in its series."""

    def __init__(self, url: str) -> None:
        self.endpoint = split_url(url)
        self.series = Series()

    async def poll(self, transport: Transport, timeout: float = FETCH_TIMEOUT) -> Report:
        return self.series.add(await scrape(transport, self.endpoint, timeout))
