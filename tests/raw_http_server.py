"""A misbehaving HTTP server on 127.0.0.1 that writes raw bytes: each request's path picks a
script that writes to the socket whatever a broken or hostile server would (a body past any
cap, an answer that trickles, an error page that is not JSON, a head cut short). Standard
library only, one thread per connection; `stop()` ends every script that is still waiting."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

#: a script: the server's stop event and the connection, the request already read
Script = Callable[[threading.Event, socket.socket], None]


def answer(status: str, body: bytes, *headers: str) -> bytes:
    """A whole HTTP/1.1 answer with a Content-Length."""
    head = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", "Connection: close", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class RawHttpServer:
    def __init__(self, scripts: dict[str, Script]) -> None:
        self.scripts = scripts
        self.paths: list[str] = []          # the request paths, in order
        self.stopped = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> None:
        self.stopped.set()
        with contextlib.suppress(OSError):  # wakes the blocked accept (a close alone does not)
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                head += chunk
            # the body too: a socket closed with unread input resets, losing what was written
            head, _, body = head.partition(b"\r\n\r\n")
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length and (chunk := conn.recv(65536)):
                body += chunk
            path = head.split(b" ", 2)[1].decode("latin-1")
            self.paths.append(path)
            script = self.scripts.get(path)
            # a client that gave up closes its end: the script's next write fails, as it should
            with contextlib.suppress(OSError):
                if script is None:
                    conn.sendall(answer("404 Not Found", b""))
                else:
                    script(self.stopped, conn)
