"""The one HTTP client (console/transport/http_client.py) against a raw misbehaving server on
127.0.0.1 (tests/raw_http_server.py), reached through the real test sshd (a direct-tcpip channel
of the host's SSH connection): a body past the cap, a server that trickles past the deadline or
says nothing, error answers with vLLM's JSON, with an HTML page, with nothing, cut short; every
failure one line naming the host, the method and URL, and what went wrong."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from socket import socket

import pytest

from console.transport.http_client import (
    CUT,
    GARBLED,
    NO_ANSWER,
    REFUSED,
    UNREACHABLE,
    HttpError,
    call,
    request,
)
from console.transport.ssh import SSHTransport
from tests.raw_http_server import RawHttpServer, answer
from tests.sshd import SSHD

pytestmark = pytest.mark.timeout(60)

CAP = 256 << 10
HTML = b"<html><body>upstream [/b] timed out</body></html>\n<p>second line</p>\n"
VLLM_400 = json.dumps({"error": {"message": "weights not found in /x", "type": "BadRequestError",
                                 "code": 400}}).encode()
DOC = {"data": [{"id": "m"}]}
#: JSON nested past Python's recursion limit: json.loads raises RecursionError, not ValueError
DEEP = b'{"error": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


def _flood(stopped: threading.Event, conn: socket) -> None:
    """A 200 with no length that never ends (1 MiB at a time)."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
    while not stopped.is_set():
        conn.sendall(bytes(1 << 20))


def _trickle(stopped: threading.Event, conn: socket) -> None:
    """A head, then a byte of body every 50 ms: each read gets something, the answer never ends."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
    while not stopped.wait(0.05):
        conn.sendall(b" ")


def _chunked(stopped: threading.Event, conn: socket) -> None:
    body = json.dumps(DOC).encode()
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Served-By: [b]x[/b]\r\n\r\n"
                 + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:5], body[5:]))
                 + b"0\r\n\r\n")


SCRIPTS = {
    "/flood": _flood,
    "/fits": lambda s, c: c.sendall(answer("200 OK", b"[" + b" " * (CAP - 1000) + b"]")),
    "/trickle": _trickle,
    "/silent": lambda s, c: s.wait(),
    "/ok": _chunked,
    "/vllm-400": lambda s, c: c.sendall(answer("400 Bad Request", VLLM_400,
                                               "Content-Type: application/json")),
    "/html-502": lambda s, c: c.sendall(answer("502 Bad Gateway", HTML,
                                               "Content-Type: text/html")),
    "/empty-500": lambda s, c: c.sendall(answer("500 Internal Server Error", b"")),
    "/cut-503": lambda s, c: c.sendall(b"HTTP/1.1 503 Service Unavailable\r\n"
                                       b"Content-Length: 100\r\n\r\n{\"error\": \"over"),
    "/cut-200": lambda s, c: c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"da"),
    "/not-json": lambda s, c: c.sendall(answer("200 OK", b"hello [/b]\n")),
    "/not-http": lambda s, c: c.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"),
    "/deep-400": lambda s, c: c.sendall(answer("400 Bad Request", DEEP)),
    "/deep-200": lambda s, c: c.sendall(answer("200 OK", DEEP)),
}


@pytest.fixture
def server() -> Iterator[RawHttpServer]:
    srv = RawHttpServer(SCRIPTS)
    yield srv
    srv.stop()


@pytest.fixture
async def box(sshd: SSHD) -> AsyncIterator[SSHTransport]:
    async with SSHTransport("box", sshd.target, known_hosts=str(sshd.known_hosts),
                            identity=str(sshd.user_key)) as t:
        yield t


async def fails(t: SSHTransport, url: str, method: str = "GET", **kw: float) -> HttpError:
    """The HttpError `call` raises, checked to be one line naming host, method and URL."""
    with pytest.raises(HttpError) as got:
        await call(t, url, method, **kw)
    e = got.value
    assert str(e) == f"box: {method} {url}: {e.why}" and "\n" not in str(e), str(e)
    return e


async def test_an_answer_is_typed_and_read_whole(box: SSHTransport, server: RawHttpServer
                                                 ) -> None:
    resp = await request(box, server.url("/ok"))
    assert resp.status == 200 and resp.phrase == "OK" and json.loads(resp.body) == DOC
    assert resp.headers["transfer-encoding"] == "chunked"
    assert resp.headers["x-served-by"] == "[b]x[/b]"      # names lower-case, values as sent
    assert await call(box, server.url("/ok")) == DOC
    # any status is an answer to `request`; `call` turns it into a refusal
    missing = await request(box, server.url("/nowhere"))
    assert (missing.status, missing.phrase, missing.body) == (404, "Not Found", b"")
    assert server.paths == ["/ok", "/ok", "/nowhere"]


async def test_a_body_over_the_cap_is_stopped_at_the_cap(box: SSHTransport,
                                                         server: RawHttpServer) -> None:
    assert len((await request(box, server.url("/fits"), limit=CAP)).body) == CAP - 998
    t0 = time.monotonic()
    with pytest.raises(HttpError) as got:
        await request(box, server.url("/flood"), limit=CAP, timeout=30)
    e = got.value
    assert time.monotonic() - t0 < 10
    assert (e.kind, e.status, e.known) == (GARBLED, None, False)
    assert str(e) == f"box: GET {server.url('/flood')}: answer larger than 256 KiB", str(e)


async def test_a_slow_server_is_given_up_at_the_deadline(box: SSHTransport,
                                                         server: RawHttpServer) -> None:
    for path, kind in (("/trickle", CUT), ("/silent", NO_ANSWER)):
        t0 = time.monotonic()
        e = await fails(box, server.url(path), "POST", timeout=1.0)
        took = time.monotonic() - t0
        assert 0.9 < took < 5, (path, took)
        assert e.kind == kind and not e.known, (path, e.kind)
        assert e.why.startswith("no answer within 1 s"), e.why
        assert ("bytes of an answer" in e.why) == (kind == CUT), e.why


async def test_error_answers_say_the_servers_reason_or_what_broke(
        box: SSHTransport, server: RawHttpServer) -> None:
    refused = {"/vllm-400": (400, "HTTP 400: weights not found in /x"),
               # not JSON: its first line, as text (markup in it stays text for the caller)
               "/html-502": (502, "HTTP 502: <html><body>upstream [/b] timed out</body></html>"),
               "/empty-500": (500, "HTTP 500 Internal Server Error"),
               "/cut-503": (503, "HTTP 503 (its message cut short)"),
               "/deep-400": (400, "HTTP 400 Bad Request")}
    for path, (status, why) in refused.items():
        e = await fails(box, server.url(path), "POST")
        assert (e.kind, e.status, e.why, e.known) == (REFUSED, status, why, True), path
    broken = {"/cut-200": (CUT, 200, "the answer (HTTP 200) was cut short: 4 of 100 bytes"),
              "/not-json": (GARBLED, 200, "an answer (HTTP 200) that is not JSON"),
              "/deep-200": (GARBLED, 200, "an answer (HTTP 200) that is not JSON"),
              "/not-http": (GARBLED, None, "not an HTTP answer (bad status line)")}
    for path, (kind, status, why) in broken.items():
        e = await fails(box, server.url(path))
        assert (e.kind, e.status, e.why, e.known) == (kind, status, why, False), path


async def test_a_port_nobody_listens_on_is_unreachable(box: SSHTransport,
                                                       server: RawHttpServer) -> None:
    url = server.url("/ok")
    server.stop()
    e = await fails(box, url)
    assert e.kind == UNREACHABLE and e.known and "refused" in e.why.lower(), e.why
