"""A small OpenAI-compatible chat completions server on 127.0.0.1 answering with a real target.

`POST /v1/chat/completions` renders the messages with the target's chat template and returns the
target's greedy reply (engine.data.target.greedy_replies, batch of one). Faults can be injected: the
first `fail_first` requests get HTTP 503, the next `drop_next` have their connection closed with
no answer, and any request whose messages contain `reject_word` gets HTTP 400.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from engine.data.target import Target, greedy_replies


class OpenAIServer:
    def __init__(self, target_dir: str, fail_first: int = 0, drop_next: int = 0,
                 reject_word: str | None = None) -> None:
        torch.set_num_threads(1)  # a tiny model: extra threads only contend with the client
        self.target = Target.load(target_dir, device="cpu")
        self.fail_first, self.drop_next, self.reject_word = fail_first, drop_next, reject_word
        self.requests: list[list[dict[str, str]]] = []  # every request that got a reply
        self.attempts = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    server.attempts += 1
                    n = server.attempts
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": "not found"}})
                if n <= server.fail_first:
                    return self._send(503, {"error": {"message": "warming up"}})
                if n <= server.fail_first + server.drop_next:
                    self.close_connection = True
                    self.connection.close()
                    return None
                msgs = body["messages"]
                if server.reject_word and any(server.reject_word in m["content"] for m in msgs):
                    return self._send(400, {"error": {"message": "prompt rejected"}})
                with server._lock:  # one generation at a time: CPU-bound anyway
                    text = greedy_replies(server.target, [msgs], body.get("max_tokens", 64))[0]
                    server.requests.append(msgs)
                return self._send(200, {
                    "id": f"chatcmpl-{n}", "object": "chat.completion", "created": int(time.time()),
                    "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}]})

            def _send(self, code: int, obj: dict[str, Any]) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def reply(self, messages: list[dict[str, str]], max_tokens: int) -> str:
        """What the server answers to these messages (the same computation, batch of one)."""
        return greedy_replies(self.target, [messages], max_tokens)[0]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
