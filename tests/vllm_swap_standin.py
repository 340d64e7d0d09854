"""A stand-in for a swappable vLLM server (dev mode, our drafter backend) on 127.0.0.1: the routes
`swap`, `bench` and `compare` ask (`/weight_info`, `/server_info?config_format=json` as vLLM 0.32
shapes it, the weight-update routes, `/v1/models`, `/metrics`), with the state they change (the
weight version, whether an update is open) and faults a test sets per route, each for the
route's next call only:

    ok        answer as vLLM does
    refuse    HTTP 400 with vLLM's error JSON (the route did nothing)
    drop      do the route's work, then close the connection with no answer
    early     close the connection with no answer, without doing anything
    badline   do the work, answer a status line that is not HTTP
    cut       do the work, send a 200 head and half its JSON body, then close
    stall     do the work, then answer nothing until the client gives up

`/v1/chat/completions` answers `max_tokens` words and moves the /metrics counters as a
drafter would: `accept[folder]` accepted tokens per draft of 3 for the drafter serving (1 by
default), so a replay measures the drafter that serves.

Every request is recorded (method, path, JSON body) in `calls`.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.vllm_metrics_standin import State, page


class SwapServer:
    def __init__(self, drafter: str, verifier: str, k: int = 3,
                 version: str = "default") -> None:
        self.drafter, self.verifier, self.k = drafter, verifier, k
        self.version = version
        self.open = False                 # an update is open (start without finish)
        self.loaded: str | None = None    # the folder the open update loaded
        self.serving = drafter            # the folder whose weights serve
        self.faults: dict[str, str] = {}
        self.calls: list[tuple[str, str, Any]] = []
        self.metrics = State(per_position=(0, 0, 0))
        self.accept: dict[str, int] = {}
        self.server_info = True           # False: /server_info is not mounted (404)
        self.dev = True                   # False: no dev mode (no weight routes either: 404)
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                server._handle(self, "GET", None)

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"null")
                server._handle(self, "POST", body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def routes(self) -> list[str]:
        """The weight-update routes called, in order."""
        return [p for m, p, _ in self.calls if m == "POST"]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def generate(self, n: int) -> None:
        """Count `n` generated tokens as the serving drafter would (as if a request came)."""
        with self._lock:
            self._generate(n)

    def _generate(self, n: int) -> None:
        a = self.accept.get(self.serving, 1)
        drafts = n // (1 + a)
        m = self.metrics
        self.metrics = replace(
            m, drafts=m.drafts + drafts, draft_tokens=m.draft_tokens + 3 * drafts,
            accepted=m.accepted + a * drafts, generation_tokens=m.generation_tokens + n,
            per_position=tuple(p + (drafts if i < a else 0) for i, p in enumerate(m.per_position)))

    # -- the routes ---------------------------------------------------------------------------
    def _work(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        with self._lock:
            route = path.split("?", 1)[0]
            if not self.dev and route not in ("/v1/models", "/v1/chat/completions"):
                return 404, {"detail": "Not Found"}
            if route == "/weight_info":
                return 200, {"weight_version": self.version}
            if route == "/server_info" and self.server_info:
                return 200, {"vllm_config": {
                    "model_config": {"model": self.verifier},
                    "speculative_config": {"method": "eagle3", "model": self.drafter,
                                           "num_speculative_tokens": self.k}},
                    "vllm_env": {}, "system_env": {}}
            if route == "/v1/models":
                return 200, {"object": "list", "data": [{"id": self.verifier,
                                                         "root": self.verifier}]}
            if route == "/v1/chat/completions" and method == "POST":
                n = int(body.get("max_tokens") or 16)
                self._generate(n)
                return 200, {"id": "chatcmpl-1", "object": "chat.completion",
                             "model": body.get("model"),
                             "choices": [{"index": 0, "finish_reason": "length",
                                          "message": {"role": "assistant",
                                                      "content": " ".join(["w"] * n)}}],
                             "usage": {"prompt_tokens": 4, "completion_tokens": n,
                                       "total_tokens": 4 + n}}
            if route == "/start_draft_weight_update" and method == "POST":
                if self.open:
                    return 400, {"error": {"message": "A weight update is already active"}}
                self.open = True
                return 200, {}
            if route == "/update_weights" and method == "POST":
                if not self.open:
                    return 400, {"error": {"message": "No weight update is active"}}
                self.loaded = body["update_info"]["path"]
                self.serving = self.loaded
                return 200, {}
            if route == "/finish_weight_update" and method == "POST":
                if not self.open:
                    return 400, {"error": {"message": "No weight update is active"}}
                self.open = False
                if (body or {}).get("weight_version") is not None:
                    self.version = body["weight_version"]
                return 200, {}
            return 404, {"detail": "Not Found"}

    def _handle(self, h: BaseHTTPRequestHandler, method: str, body: Any) -> None:
        self.calls.append((method, h.path, body))
        route = h.path.split("?", 1)[0]
        if route == "/metrics":
            with self._lock:
                data = page(self.metrics).encode()
            h.send_response(200)
            h.send_header("Content-Type", "text/plain")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
            return
        fault = self.faults.pop(route, "ok")
        if fault == "refuse":
            status, doc = 400, {"error": {"message": f"refused {route} [/b]"}}
        elif fault == "early":
            h.close_connection = True
            return
        else:
            status, doc = self._work(method, h.path, body)
        data = json.dumps(doc).encode()
        if fault in ("drop", "stall"):
            if fault == "stall":
                time.sleep(30)
            h.close_connection = True
            return
        if fault == "badline":
            h.wfile.write(b"HTTP/1.1 OKAY\r\n\r\n" + data)
            h.close_connection = True
            return
        if fault == "cut":
            h.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                          + f"Content-Length: {len(data) + 40}\r\n\r\n".encode()
                          + b'{"weight_version": "[/b]\x1b[2J')
            h.close_connection = True
            return
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
