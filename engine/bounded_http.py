"""One HTTP request with bounds: an overall deadline and a cap on the answer's size.

A socket timeout bounds each read, not the request: a server that answers one byte a second
never trips it, and an answer read whole with `read()` grows until memory runs out. Every HTTP
client of the engine (`regen`, `prepare --from-vllm`, `train --online --from-vllm`) sends its
requests through `send`:
  - the whole request (connect, send, headers, body) ends by `deadline_s`: a watchdog thread
    shuts the socket down at the deadline, which ends a read that is blocked or trickling, and
    the request raises `DeadlineExceeded` (a TimeoutError: callers retry it like a timeout);
  - the answer's body is read in chunks up to `max_bytes` (a declared Content-Length over it is
    refused before reading): more raises `AnswerTooLarge`, which is not retried.
An error answer is quoted by `error_reason`: vLLM's (and OpenAI's) own message, not its JSON.
Standard library only (http.client), so the connection can be kept alive between requests.
"""

from __future__ import annotations

import heapq
import http.client
import itertools
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass

from engine.http_reason import server_message

MAX_ANSWER_BYTES = 64 << 20  # a chat reply or a completion's answer is kilobytes
_CHUNK = 1 << 16


class DeadlineExceeded(TimeoutError):
    """The request did not complete within its deadline."""


class AnswerTooLarge(Exception):
    """The answer's body is larger than the cap."""


@dataclass
class Answer:
    status: int
    body: bytes


def error_reason(body: bytes, room: int = 500) -> str:
    """The server's own message in an error answer (engine/http_reason.py), at most `room`
    characters; else the body's first line (JSON without a message), or `(no body)`."""
    text = server_message(body) or body.decode("utf-8", errors="replace").strip()
    return (text.splitlines() or ["(no body)"])[0][:room]


def connection(url: str, timeout: float) -> http.client.HTTPConnection:
    """A (not yet connected) connection to the host of `url`, http or https."""
    u = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    return cls(u.hostname or "", u.port, timeout=timeout)


class _Watchdog:
    """One daemon thread that shuts down the sockets of requests past their deadline."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int, list[object]]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, deadline: float, sock: socket.socket) -> list[object]:
        entry: list[object] = [sock, False]  # [socket or None once disarmed, fired]
        with self._cv:
            heapq.heappush(self._heap, (deadline, next(self._seq), entry))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="http-deadline",
                                                daemon=True)
                self._thread.start()
            self._cv.notify()
        return entry

    def disarm(self, entry: list[object]) -> bool:
        """Stop watching; whether the deadline had already fired."""
        with self._cv:
            entry[0] = None
            return bool(entry[1])

    def _run(self) -> None:
        with self._cv:
            while True:
                while self._heap and self._heap[0][2][0] is None:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cv.wait()
                    continue
                deadline, _, entry = self._heap[0]
                left = deadline - time.monotonic()
                if left > 0:
                    self._cv.wait(left)
                    continue
                heapq.heappop(self._heap)
                sock = entry[0]
                entry[1] = True
                if isinstance(sock, socket.socket):
                    try:
                        sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked read: it sees EOF
                    except OSError:
                        pass


_WATCHDOG = _Watchdog()


def send(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None,
         headers: dict[str, str], deadline_s: float, max_bytes: int = MAX_ANSWER_BYTES
         ) -> Answer:
    """One request on `conn` within `deadline_s` seconds, its answer at most `max_bytes` long
    (module docstring). On any exception the connection is closed (the next request
    reconnects); OSError and http.client.HTTPException pass through as they are."""
    end = time.monotonic() + deadline_s
    entry = None
    try:
        if conn.sock is None:
            conn.timeout = deadline_s
            conn.connect()
        sock = conn.sock
        assert sock is not None
        sock.settimeout(max(0.001, end - time.monotonic()))
        entry = _WATCHDOG.arm(end, sock)
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        data = _read_capped(resp, max_bytes)
        if _WATCHDOG.disarm(entry):
            raise DeadlineExceeded(f"no complete answer within {deadline_s:g} s")
        if resp.will_close:
            conn.close()
        return Answer(resp.status, data)
    except BaseException as e:
        conn.close()
        if entry is not None and _WATCHDOG.disarm(entry) and not isinstance(e, AnswerTooLarge):
            raise DeadlineExceeded(f"no complete answer within {deadline_s:g} s") from None
        raise


def _read_capped(resp: http.client.HTTPResponse, max_bytes: int) -> bytes:
    declared = resp.getheader("Content-Length")
    if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
        raise AnswerTooLarge(f"the answer is {int(declared)} bytes, more than the "
                             f"{max_bytes >> 20} MiB allowed")
    parts: list[bytes] = []
    size = 0
    while True:
        chunk = resp.read(_CHUNK)
        if not chunk:
            return b"".join(parts)
        size += len(chunk)
        if size > max_bytes:
            raise AnswerTooLarge(f"the answer is longer than the {max_bytes >> 20} MiB allowed")
        parts.append(chunk)
