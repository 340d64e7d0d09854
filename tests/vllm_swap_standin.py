"""A stand-in for a swappable vLLM server (dev mode, our drafter backend) on 127.0.0.1, for the
console (`swap`, `bench`, `compare`) and for `train --eval-server`: the routes they ask
(`/weight_info`, `/server_info?config_format=json` as vLLM 0.32 shapes it, the weight-update
routes, `/v1/models`, `/metrics`, `/v1/completions`, `/v1/chat/completions`), with the state
they change (the weight version, whether an update is open, the folder whose weights serve).
`/update_weights` reads nothing: it checks the folder holds weights (unless `need_weights` is
off), waits `swap_s` (a large drafter's read) and serves it.

Completions answer `max_tokens` tokens and move the /metrics counters as a drafter would:
`accept[folder]` accepted tokens per draft of 3 for the drafter serving (1 by default), so a
replay measures the drafter that serves.

Faults: `fault(method, path)` names a fault for a request, or None; by default it is the
request's route in `faults`, each for the route's next call only. `early` and `refuse` do
nothing; every other fault does the route's work first, then answers wrongly:

    ok        answer as vLLM does
    refuse    HTTP 400 with vLLM's error JSON (the route did nothing)
    early     close the connection with no answer
    drop      close the connection with no answer
    badline   a status line that is not HTTP
    cut       a 200 head and half its JSON body (markup and an escape), then close
    stall     nothing until the client gives up
    nan       a /metrics page with a NaN drafts counter
    words     `"completion_tokens": "eight"`
    list      a JSON list
    huge      a 100 MiB answer with no Content-Length

Every request is recorded (method, path, JSON body) in `calls`. Light to import (no torch): it
runs in the test process beside the engine subprocesses that talk to it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.vllm_metrics_standin import MODEL, State, page

WEIGHT_ROUTES = ("/start_draft_weight_update", "/update_weights", "/finish_weight_update")
STALL_S = 60.0


class SwapServer:
    def __init__(self, drafter: str | Path, verifier: str = MODEL, k: int = 3,
                 version: str = "default", *, swap_s: float = 0.0, need_weights: bool = True,
                 fault: Callable[[str, str], str | None] | None = None, port: int = 0) -> None:
        self.drafter, self.verifier, self.k = str(drafter), verifier, k
        self.version = version
        self.open = False                 # an update is open (start without finish)
        self.serving = self.drafter       # the folder whose weights serve
        self.swap_s = swap_s
        self.need_weights = need_weights  # False: any folder loads (no files needed)
        self.faults: dict[str, str] = {}
        self.fault = fault or self._next_fault
        self.calls: list[tuple[str, str, Any]] = []
        self.updates: list[str] = []      # the folders update_weights finished loading
        self.metrics = State(per_position=(0, 0, 0))
        self.accept: dict[str, int] = {}
        self.server_info = True           # False: /server_info is not mounted (404)
        self.dev = True                   # False: no dev mode (no weight routes either: 404)
        self._lock = threading.Lock()
        self._closed = threading.Event()
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

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    # -- what a test asks ----------------------------------------------------------------------
    def routes(self) -> list[str]:
        """The weight-update routes called, in order."""
        with self._lock:
            return [p for m, p, _ in self.calls if m == "POST" and p in WEIGHT_ROUTES]

    def bodies(self, method: str, path: str) -> list[Any]:
        """The bodies of the requests to one route, in order."""
        with self._lock:
            return [b for m, p, b in self.calls if (m, p) == (method, path)]

    def swaps_in(self) -> list[str]:
        """The folders update_weights was asked to load (finished or not)."""
        return [b["update_info"]["path"] for b in self.bodies("POST", "/update_weights")]

    def close(self) -> None:
        self._closed.set()
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

    def _next_fault(self, method: str, path: str) -> str | None:
        return self.faults.pop(path.split("?", 1)[0], None)

    # -- the routes ---------------------------------------------------------------------------
    def _work(self, method: str, route: str, body: Any) -> tuple[int, Any]:
        if (method, route) == ("POST", "/update_weights") and self.dev:
            return self._update(body["update_info"]["path"])
        with self._lock:
            if not self.dev and route not in ("/v1/models", "/v1/chat/completions",
                                              "/v1/completions", "/metrics"):
                return 404, {"detail": "Not Found"}
            if route == "/metrics":
                return 200, page(self.metrics)
            if route == "/weight_info":
                return 200, {"weight_version": self.version}
            if route == "/server_info" and self.server_info:
                return 200, {"vllm_config": {
                    "model_config": {"model": self.verifier},
                    "speculative_config": {"method": "eagle3", "model": self.drafter,
                                           "num_speculative_tokens": self.k}},
                    "vllm_env": {}, "system_env": {}}
            if route == "/v1/models":
                return 200, {"object": "list", "data": [{"id": self.verifier, "object": "model",
                                                         "root": self.verifier}]}
            if route in ("/v1/chat/completions", "/v1/completions") and method == "POST":
                return 200, self._complete(route, body)
            if route == "/start_draft_weight_update" and method == "POST":
                if self.open:
                    return 400, {"error": {"message": "A weight update is already active"}}
                self.open = True
                return 200, {}
            if route == "/finish_weight_update" and method == "POST":
                if not self.open:
                    return 400, {"error": {"message": "No weight update is active"}}
                self.open = False
                if (body or {}).get("weight_version") is not None:
                    self.version = body["weight_version"]
                return 200, {}
            return 404, {"detail": "Not Found"}

    def _update(self, folder: str) -> tuple[int, Any]:
        with self._lock:
            if not self.open:
                return 400, {"error": {"message": "No weight update is active"}}
        if self.need_weights and not list(Path(folder).glob("*.safetensors")):
            return 400, {"error": {"message": f"cannot load {folder}"}}
        self._closed.wait(self.swap_s)   # outside the lock: /metrics answers meanwhile
        with self._lock:
            self.serving = folder
            self.updates.append(folder)
        return 200, {}

    def _complete(self, route: str, body: Any) -> dict[str, Any]:
        n = int(body.get("max_tokens") or 16)
        self._generate(n)
        if route == "/v1/completions":
            prompt = len(body.get("prompt") or [])
            return {"id": "cmpl-1", "object": "text_completion", "model": body.get("model"),
                    "choices": [{"index": 0, "text": "x" * n, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": prompt, "completion_tokens": n,
                              "total_tokens": prompt + n}}
        return {"id": "chatcmpl-1", "object": "chat.completion", "model": body.get("model"),
                "choices": [{"index": 0, "finish_reason": "length",
                             "message": {"role": "assistant", "content": " ".join(["w"] * n)}}],
                "usage": {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}}

    def _handle(self, h: BaseHTTPRequestHandler, method: str, body: Any) -> None:
        with self._lock:
            self.calls.append((method, h.path, body))
        route = h.path.split("?", 1)[0]
        fault = self.fault(method, h.path) or "ok"
        if fault == "early":
            h.close_connection = True
            return
        if fault == "refuse":
            return _send(h, 400, {"error": {"message": f"refused {route} [/b]"}})
        status, doc = self._work(method, route, body)
        if fault == "ok":
            return _send(h, status, doc)
        if fault == "nan":
            with self._lock:
                text = page(replace(self.metrics, drafts=float("nan")))  # type: ignore[arg-type]
            return _send(h, 200, text.replace(" nan\n", " NaN\n"))
        if fault == "words":
            return _send(h, 200, {"choices": [], "usage": {"completion_tokens": "eight"}})
        if fault == "list":
            return _send(h, 200, [1, 2, 3])
        h.close_connection = True
        data = json.dumps(doc).encode()
        try:
            if fault == "stall":
                self._closed.wait(STALL_S)
            elif fault == "badline":
                h.wfile.write(b"HTTP/1.1 OKAY\r\n\r\n" + data)
            elif fault == "cut":
                h.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                              + f"Content-Length: {len(data) + 40}\r\n\r\n".encode()
                              + b'{"weight_version": "[/b]\x1b[2J')
            elif fault == "huge":   # no Content-Length: only reading tells how long it is
                h.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                              b"Connection: close\r\n\r\n")
                for _ in range(100):
                    h.wfile.write(b" " * (1 << 20))
            elif fault != "drop":
                raise ValueError(f"unknown fault {fault!r}")
        except OSError:
            pass   # the client gave up: what the fault is for
        return None


def _send(h: BaseHTTPRequestHandler, code: int, doc: Any) -> None:
    """An answer: a str is the /metrics page (Prometheus text), anything else JSON."""
    if isinstance(doc, str):
        data, kind = doc.encode(), "text/plain; version=0.0.4"
    else:
        data, kind = json.dumps(doc).encode(), "application/json"
    try:
        h.send_response(code)
        h.send_header("Content-Type", kind)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
    except OSError:
        pass
