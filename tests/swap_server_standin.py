"""A stand-in for the vLLM that `serve` starts (weight-update routes, our drafter backend) on
127.0.0.1, for `train --eval-server`: it answers /v1/models, /weight_info, /server_info, the
three swap routes, /metrics and /v1/completions the way vLLM 0.32 does, and keeps what a test
asks about: the weight version it reports, the folder whose weights it serves (`loaded`), every
request. A swap reads nothing: `update_weights` checks the folder holds weights, waits `swap_s`
(a large drafter's read) and serves it.

Faults, for tests: `fault(method, path)` returns a fault's name for a request, or None:
`nan` (a /metrics page with a NaN counter), `words` (`"completion_tokens": "eight"`), `list` (a
JSON list), `huge` (a 100 MiB answer, no Content-Length), `badstatus` (a status line that is
not one), `stall` (nothing until the client gives up), `refuse` (HTTP 500). Light to import
(no torch): the server runs beside the engine subprocesses that talk to it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODEL = "demo/eagle3-target"
FAULTS = ("nan", "words", "list", "huge", "badstatus", "stall", "refuse")


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True


class SwapServerStandin:
    def __init__(self, drafter: Path, swap_s: float = 0.0,
                 fault: Callable[[str, str], str | None] | None = None) -> None:
        self.drafter = str(drafter)        # the speculative model it started with
        self.version = "default"
        self.loaded = self.drafter         # whose weights serve now
        self.active = False                # a weight update is open
        self.swap_s = swap_s
        self.fault = fault
        self.requests: list[tuple[str, str, Any]] = []
        self.updates: list[str] = []       # the folders update_weights finished loading
        self.drafts = self.accepted = self.generated = 0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                server._handle(self, "GET", None)

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                server._handle(self, "POST", body)

        self.httpd = _HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    # -- what a test asks ----------------------------------------------------------------------
    def paths(self, method: str, path: str) -> list[Any]:
        """The bodies of the requests to one route, in order."""
        with self._lock:
            return [b for m, p, b in self.requests if (m, p) == (method, path)]

    def swaps_in(self) -> list[str]:
        """The folders update_weights was asked to load (finished or not)."""
        return [b["update_info"]["path"] for b in self.paths("POST", "/update_weights")]

    def close(self) -> None:
        self._closed.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- answers -------------------------------------------------------------------------------
    def _handle(self, h: BaseHTTPRequestHandler, method: str, body: Any) -> None:
        path = h.path
        with self._lock:
            self.requests.append((method, path, body))
        fault = self.fault(method, path) if self.fault is not None else None
        if fault is not None:
            return self._fault(h, fault)
        route = path.split("?", 1)[0]
        if (method, route) == ("GET", "/v1/models"):
            return _send(h, 200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        if (method, route) == ("GET", "/weight_info"):
            return _send(h, 200, {"weight_version": self.version})
        if (method, route) == ("GET", "/server_info"):
            return _send(h, 200, {"vllm_config": {"speculative_config": {
                "model": self.drafter, "method": "eagle3", "num_speculative_tokens": 3}}})
        if (method, route) == ("GET", "/metrics"):
            return _send_text(h, 200, self._page(self.drafts, self.accepted, self.generated))
        if (method, route) == ("POST", "/start_draft_weight_update"):
            if self.active:
                return _send(h, 400, {"error": "a weight update is already active"})
            self.active = True
            return _send(h, 200, {})
        if (method, route) == ("POST", "/update_weights"):
            folder = body["update_info"]["path"]
            if not self.active or not list(Path(folder).glob("*.safetensors")):
                return _send(h, 400, {"error": f"cannot load {folder}"})
            self._closed.wait(self.swap_s)
            self.loaded = folder
            with self._lock:
                self.updates.append(folder)
            return _send(h, 200, {})
        if (method, route) == ("POST", "/finish_weight_update"):
            if (body or {}).get("weight_version"):
                self.version = body["weight_version"]
            self.active = False
            return _send(h, 200, {})
        if (method, route) == ("POST", "/v1/completions"):
            n = min(int(body["max_tokens"]), 5)
            with self._lock:
                self.generated += n
                self.drafts += 2
                self.accepted += 3
            return _send(h, 200, {"id": "cmpl-1", "object": "text_completion", "model": MODEL,
                                  "choices": [{"index": 0, "text": "x" * n,
                                               "finish_reason": "length"}],
                                  "usage": {"prompt_tokens": len(body["prompt"]),
                                            "completion_tokens": n,
                                            "total_tokens": len(body["prompt"]) + n}})
        return _send(h, 404, {"detail": "Not Found"})

    def _page(self, drafts: float, accepted: float, generated: float) -> str:
        labels = f'engine="0",model_name="{MODEL}"'
        return "\n".join([
            "# TYPE vllm:spec_decode_num_drafts_total counter",
            f"vllm:spec_decode_num_drafts_total{{{labels}}} {float(drafts)!r}",
            f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {3.0 * drafts!r}",
            f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {float(accepted)!r}",
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="0"}} '
            f"{float(accepted)!r}",
            f"vllm:generation_tokens_total{{{labels}}} {float(generated)!r}", ""])

    def _fault(self, h: BaseHTTPRequestHandler, fault: str) -> None:
        if fault == "nan":
            return _send_text(h, 200, self._page(float("nan"), self.accepted, self.generated)
                              .replace("nan", "NaN"))
        if fault == "words":
            return _send(h, 200, {"choices": [], "usage": {"completion_tokens": "eight"}})
        if fault == "list":
            return _send(h, 200, [1, 2, 3])
        if fault == "refuse":
            return _send(h, 500, {"error": "internal error"})
        h.close_connection = True
        try:
            if fault == "huge":   # no Content-Length: only reading tells how long it is
                h.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                              b"Connection: close\r\n\r\n")
                chunk = b" " * (1 << 20)
                for _ in range(100):
                    h.wfile.write(chunk)
            elif fault == "badstatus":
                h.wfile.write(b"this is no status line\r\n\r\n")
            elif fault == "stall":
                self._closed.wait(120)
        except OSError:
            pass   # the client gave up: what the fault is for
        return None


def _send(h: BaseHTTPRequestHandler, code: int, obj: Any) -> None:
    _send_bytes(h, code, json.dumps(obj).encode(), "application/json")


def _send_text(h: BaseHTTPRequestHandler, code: int, text: str) -> None:
    _send_bytes(h, code, text.encode(), "text/plain; version=0.0.4")


def _send_bytes(h: BaseHTTPRequestHandler, code: int, data: bytes, kind: str) -> None:
    try:
        h.send_response(code)
        h.send_header("Content-Type", kind)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
    except OSError:
        pass

