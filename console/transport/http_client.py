"""HTTP requests to a server on a host (vLLM's API and /metrics), through the host's own
connection.

The server listens on the host (usually its loopback only). A request goes through
`Transport.open_tcp`: a direct-tcpip channel of the host's SSH connection (a plain loopback
connection for the `local` host), so no port is opened anywhere and no HTTP crosses the network
outside SSH. One HTTP/1.1 request with `Connection: close`; the answer is read to its end,
de-chunked and, if the server insists, gunzipped, all within one deadline.

MAX_RESPONSE bounds both the bytes read and the bytes a compressed body inflates to (a 130 KB
gzip bomb inflates to 128 MiB: it is stopped at the cap, never held whole). Parsing and
inflating run in a worker thread, off the event loop the TUI draws from.

A failure is an HttpError: one line naming host, method, URL and why, with a `kind` that says
what is known of the request's fate, because a weight update that failed half-way must not be
worded as one that never happened:

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
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from console.errors import ConsoleError, TransportError
from console.settings.metrics_url import Endpoint, split_url
from console.transport.base import Transport
from engine.http_reason import server_message

UNREACHABLE, REFUSED, NO_ANSWER, CUT, GARBLED = \
    "unreachable", "refused", "no answer", "cut", "garbled"
#: a vLLM /metrics page is 50-200 KB, a JSON answer kilobytes: anything this big is not one
MAX_RESPONSE = 32 << 20
EXCERPT = 160       # characters of a server's text an error quotes
REASON = 300        # characters of a server's own error message
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class HttpError(ConsoleError):
    """The server did not answer the request as asked: one line with host, method, URL, why;
    `kind` says what is known of the request's fate (module docstring)."""

    def __init__(self, host: str, what: str, why: str, status: int | None = None,
                 kind: str = REFUSED) -> None:
        super().__init__(f"{host}: {what}: {why}")
        self.host, self.what, self.why, self.status, self.kind = host, what, why, status, kind

    @property
    def known(self) -> bool:
        """True when the server is known to have not done what was asked (never reached, or
        it said no); False when it may have done it."""
        return self.kind in (UNREACHABLE, REFUSED)


@dataclass(frozen=True)
class Response:
    """A whole HTTP answer: its status, headers (names lower-case) and body (de-chunked,
    inflated, at most the cap). `whole` is False only for an error status whose body was cut
    short or cannot be read (its message is then not quoted)."""

    status: int
    phrase: str
    headers: Mapping[str, str]
    body: bytes
    whole: bool = True

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


class _Broken(Exception):
    """What came back is not a whole answer: (kind, status, why)."""

    def __init__(self, kind: str, status: int | None, why: str) -> None:
        super().__init__(why)
        self.kind, self.status, self.why = kind, status, why


def size(n: int) -> str:
    """A byte count for a message: 32 MiB, 64 KiB."""
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def excerpt(text: str, room: int = EXCERPT) -> str:
    """The start of a server's text for an error line: its first line, at most `room`
    characters, the length of what was left out said."""
    first = text.split("\n", 1)[0]
    if len(first) <= room and len(first) == len(text):
        return text
    return first[:room] + f"… ({len(text) - min(len(first), room)} more characters)"


def server_reason(body: bytes) -> str:
    """vLLM's own message in an error answer (engine/http_reason.py), cut to a line; "" when
    there is none."""
    return excerpt(server_message(body), REASON)


def refusal(resp: Response) -> tuple[str, int]:
    """An error status as one line (the server's reason when it gave one) and the status."""
    if not resp.whole:
        return f"HTTP {resp.status} (its message cut short)", resp.status
    reason = server_reason(resp.body)
    tail = f": {reason}" if reason else (f" {excerpt(resp.phrase)}" if resp.phrase else "")
    return f"HTTP {resp.status}{tail}", resp.status


def request_bytes(method: str, ep: Endpoint, body: bytes | None, accept: str) -> bytes:
    host = ep.host if ":" not in ep.host else f"[{ep.host}]"
    head = [f"{method} {ep.path} HTTP/1.1", f"Host: {host}:{ep.port}",
            "User-Agent: eagle3-console", f"Accept: {accept}", "Accept-Encoding: identity",
            "Connection: close"]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + (body or b"")


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    i = 0
    while True:
        end = data.find(b"\r\n", i)
        if end < 0:
            raise _Broken(CUT, None, "cut short (chunked body)")
        try:
            size = int(data[i:end].split(b";")[0].strip() or b"x", 16)
        except ValueError:
            raise _Broken(GARBLED, None, "a bad chunk size") from None
        if size == 0:
            return bytes(out)
        start = end + 2
        if start + size > len(data):
            raise _Broken(CUT, None, "cut short (chunked body)")
        out += data[start:start + size]
        i = start + size + 2


def inflate(data: bytes, wbits: int, limit: int = MAX_RESPONSE) -> bytes:
    """A gzip / zlib body inflated to at most `limit` bytes (the output is made in one bounded
    call: zlib stops at max_length and keeps the rest of the input)."""
    d = zlib.decompressobj(wbits)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as e:
        raise _Broken(GARBLED, None, f"not valid compressed data ({e})") from None
    if len(out) > limit or d.unconsumed_tail:
        raise _Broken(GARBLED, None, f"compressed, it inflates past {size(limit)}")
    if not d.eof:
        raise _Broken(CUT, None, "cut short (compressed body)")
    return out


def _body(rest: bytes, headers: Mapping[str, str], limit: int) -> bytes:
    """The body as meant: de-chunked or cut to its Content-Length, then inflated."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        rest = _dechunk(rest)
    elif "content-length" in headers:
        try:
            n = int(headers["content-length"])
        except ValueError:
            raise _Broken(GARBLED, None, "a bad Content-Length") from None
        if len(rest) < n:
            raise _Broken(CUT, None, f"cut short: {len(rest)} of {n} bytes")
        rest = rest[:n]
    encoding = headers.get("content-encoding", "identity").lower()
    if encoding in _WBITS:
        return inflate(rest, _WBITS[encoding], limit)
    if encoding != "identity":
        raise _Broken(GARBLED, None, f"unsupported content encoding {excerpt(encoding)!r}")
    return rest


def parse(raw: bytes, limit: int = MAX_RESPONSE) -> Response:
    """The answer in `raw` (read until the server closed); _Broken when it is not a whole
    HTTP/1.x answer. An error status whose body is broken is still an answer (not `whole`)."""
    if not raw:
        raise _Broken(NO_ANSWER, None, "the connection closed with no answer")
    head, sep, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if not sep and raw.startswith(b"HTTP/"):
        raise _Broken(CUT, None, f"the answer was cut short in its head ({len(raw)} bytes)")
    if not sep or len(parts) < 2 or not parts[0].startswith("HTTP/1.") \
            or not (parts[1].isdigit() and len(parts[1]) == 3):
        raise _Broken(GARBLED, None, "not an HTTP answer (bad status line)")
    status, phrase = int(parts[1]), parts[2].strip() if len(parts) > 2 else ""
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    try:
        body = _body(rest, headers, limit)
    except _Broken as e:
        if status != 200:   # the status says no; its message did not all come
            return Response(status, phrase, headers, b"", whole=False)
        kind = e.kind
        raise _Broken(kind, status, f"the answer (HTTP 200) was {e.why}" if kind == CUT
                      else f"an answer (HTTP 200) whose body cannot be read: {e.why}") from None
    return Response(status, phrase, headers, body)


async def request(transport: Transport, url: str, method: str = "GET", body: bytes | None = None,
                  *, accept: str = "application/json", timeout: float = 60.0,
                  limit: int = MAX_RESPONSE) -> Response:
    """The answer to `method url` (any status), `body` sent as JSON; HttpError when no whole
    answer came (module docstring). ValueError for a URL that is not http://host[:port]/path."""
    ep = split_url(url)
    what = f"{method} {url}"
    sent = False
    raw = bytearray()

    async def go() -> None:
        nonlocal sent
        async with await transport.open_tcp(ep.host, ep.port) as stream:
            sent = True   # from here on the server may act on the request
            await stream.write(request_bytes(method, ep, body, accept))
            while chunk := await stream.read():
                raw.extend(chunk)
                if len(raw) > limit:
                    raise HttpError(transport.name, what, f"answer larger than {size(limit)}",
                                    None, GARBLED)

    try:
        await asyncio.wait_for(go(), timeout)
    except HttpError:
        raise
    except asyncio.TimeoutError as e:
        got = f" ({len(raw)} bytes of an answer)" if raw else ""
        raise HttpError(transport.name, what, f"no answer within {timeout:g} s{got}", None,
                        CUT if raw else NO_ANSWER) from e
    except (TransportError, OSError, EOFError) as e:
        # the transport's message starts with the host name: keep only its reason
        why = str(e).removeprefix(f"{transport.name}: ")
        if not sent:
            raise HttpError(transport.name, what, why, None, UNREACHABLE) from e
        raise HttpError(transport.name, what, f"the connection broke ({why})"
                        + (f" after {len(raw)} bytes of an answer" if raw else ""),
                        None, CUT if raw else NO_ANSWER) from e
    try:
        return await asyncio.to_thread(parse, bytes(raw), limit)  # inflating is not for the loop
    except _Broken as e:
        raise HttpError(transport.name, what, e.why, e.status, e.kind) from None


async def fetch_ok(transport: Transport, url: str, method: str = "GET", body: bytes | None = None,
                   *, accept: str = "application/json", timeout: float = 60.0) -> Response:
    """`request`, and an HttpError (`refused`, with the server's reason) unless HTTP 200."""
    resp = await request(transport, url, method, body, accept=accept, timeout=timeout)
    if resp.status != 200:
        why, status = refusal(resp)
        raise HttpError(transport.name, f"{method} {url}", why, status, REFUSED)
    return resp


async def call(transport: Transport, url: str, method: str = "GET", body: Any = None,
               timeout: float = 60.0) -> Any:
    """The JSON answer of `method url` (with `body` as JSON); HttpError otherwise."""
    data = None if body is None else json.dumps(body).encode("utf-8")
    text = (await fetch_ok(transport, url, method, data, timeout=timeout)).text
    try:
        return json.loads(text) if text.strip() else None
    except (ValueError, RecursionError):
        raise HttpError(transport.name, f"{method} {url}", "an answer (HTTP 200) that is not "
                        "JSON", 200, GARBLED) from None
