"""A stand-in for a vLLM server running hidden-state extraction, on 127.0.0.1, with a real target.

It answers `GET /v1/models` and `POST /v1/completions` (`prompt` = token ids, `max_tokens` 1) the
way vLLM with `--speculative-config {"method": "extract_hidden_states", ...}` and the
ExampleHiddenStatesConnector does: it runs a real transformers target on the prompt (concurrent
requests are batched, right-padded, as vLLM batches them), captures the configured layer ids
(id k < N: the INPUT of decoder layer k; id N: the last layer's output before the final norm), and
writes STORAGE/<request id>.safetensors with `hidden_states` [T, L, H] and `token_ids` [T] (int64)
from a writer thread, holding an exclusive flock on `<file>.lock` from before the answer is sent
until the write is complete. The answer carries `kv_transfer_params.hidden_states_path`.

Faults, for tests: the first `fail_first` requests get HTTP 503; the next `drop_next` have their
connection closed unanswered; after `die_after` answered requests the server dies (listener
closed, later connections refused); prompts in `wrong_ids_for` get a file with other token ids,
prompts in `nan_for` a NaN in their hidden states; `slow_write_s` writes half the file, waits,
then writes the rest (a reader that skips the lock reads a torn file).

Run alone: `python -m tests.vllm_standin --target DIR --storage DIR [--port P]` prints its URL.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import queue
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch


class _HTTPServer(ThreadingHTTPServer):
    request_queue_size = 1024  # the listen backlog: vLLM's (uvicorn) is 2048, http.server's 5
    daemon_threads = True


class _Job:
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self.done = threading.Event()
        self.hidden: torch.Tensor | None = None


class VllmStandin:
    def __init__(self, target_dir: str, storage: str, layer_ids: list[int] | None = None,
                 model_name: str = "standin-target", port: int = 0, fail_first: int = 0,
                 drop_next: int = 0, die_after: int | None = None,
                 wrong_ids_for: set[tuple[int, ...]] | None = None,
                 nan_for: set[tuple[int, ...]] | None = None, slow_write_s: float = 0.0,
                 batch_tokens: int = 16384, threads: int = 1) -> None:
        from transformers import AutoModelForCausalLM

        from engine.capture.server import capture_layer_ids
        from engine.data.target import default_aux_ids
        torch.set_num_threads(threads)
        self.model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
        self.model.eval().requires_grad_(False)
        n = int(self.model.config.num_hidden_layers)
        self.layer_ids = layer_ids or capture_layer_ids(default_aux_ids(n), n)
        self.storage = os.path.abspath(storage)
        os.makedirs(self.storage, exist_ok=True)
        self.model_name = model_name
        self.fail_first, self.drop_next, self.die_after = fail_first, drop_next, die_after
        self.taken = 0  # requests taken to be answered
        self.wrong_ids_for = wrong_ids_for or set()
        self.nan_for = nan_for or set()
        self.slow_write_s = slow_write_s
        self.batch_tokens = batch_tokens
        self.attempts = 0
        self.answered: list[list[int]] = []  # prompts answered, in order
        self.dead = False
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._writes: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.httpd = _HTTPServer(("127.0.0.1", port), self._handler())
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._threads = [threading.Thread(target=self._batcher, daemon=True),
                         threading.Thread(target=self._writer, daemon=True),
                         threading.Thread(target=self.httpd.serve_forever, daemon=True)]
        for t in self._threads:
            t.start()

    # -- the target ---------------------------------------------------------------------------
    @torch.no_grad()
    def _features(self, seqs: list[list[int]]) -> list[torch.Tensor]:
        """[T, L, H] per prompt: pre-hooks on the decoder layers and the final norm."""
        base = self.model.base_model
        n = len(base.layers)
        got: dict[int, torch.Tensor] = {}

        def grab(k: int) -> Any:
            def hook(_m: Any, args: tuple, kwargs: dict) -> None:
                got[k] = args[0] if args else kwargs["hidden_states"]
            return hook

        handles = [(base.layers[k] if k < n else base.norm).register_forward_pre_hook(
            grab(k), with_kwargs=True) for k in self.layer_ids]
        width = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        att = torch.zeros(len(seqs), width, dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, :len(s)] = torch.tensor(s)
            att[r, :len(s)] = 1
        try:
            base(input_ids=ids, attention_mask=att, use_cache=False)
        finally:
            for h in handles:
                h.remove()
        stacked = torch.stack([got[k] for k in self.layer_ids], dim=2)  # [B, W, L, H]
        return [stacked[r, :len(s)].clone() for r, s in enumerate(seqs)]

    def _batcher(self) -> None:
        while True:
            first = self._jobs.get()
            if first is None:
                return
            batch = [first]
            while True:  # what queued up meanwhile joins the batch (continuous batching)
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    self._jobs.put(None)
                    break
                batch.append(job)
                if max(len(j.ids) for j in batch) * len(batch) >= self.batch_tokens:
                    break
            for job, hs in zip(batch, self._features([j.ids for j in batch]), strict=True):
                job.hidden = hs
                job.done.set()

    # -- the connector's files ----------------------------------------------------------------
    def _writer(self) -> None:
        from safetensors.torch import save, save_file
        while True:
            item = self._writes.get()
            if item is None:
                return
            path, tensors, lock_fd = item
            try:
                if self.slow_write_s:
                    blob = save(tensors)
                    with open(path, "wb") as f:
                        f.write(blob[: len(blob) // 2])
                        f.flush()
                        time.sleep(self.slow_write_s)
                        f.write(blob[len(blob) // 2:])
                else:
                    save_file(tensors, path)
            finally:
                os.close(lock_fd)  # releases LOCK_EX: readers waiting on LOCK_SH proceed

    def _answer(self, ids: list[int]) -> str:
        job = _Job(ids)
        self._jobs.put(job)
        job.done.wait()
        hs = job.hidden
        assert hs is not None
        if tuple(ids) in self.nan_for:
            hs[len(ids) // 2, -1, 0] = float("nan")
        token_ids = torch.tensor(ids, dtype=torch.int64)
        if tuple(ids) in self.wrong_ids_for:
            token_ids[len(ids) // 2] += 1
        path = os.path.join(self.storage, f"cmpl-{uuid.uuid4().hex}-0.safetensors")
        lock_fd = os.open(path + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # held before the client learns the path
        self._writes.put((path, {"hidden_states": hs.contiguous(), "token_ids": token_ids},
                          lock_fd))
        return path

    # -- HTTP ---------------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if server.dead:
                    return self._drop()
                if self.path != "/v1/models":
                    return self._send(404, {"error": {"message": "not found"}})
                return self._send(200, {"object": "list", "data": [
                    {"id": server.model_name, "object": "model", "owned_by": "vllm"}]})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    server.attempts += 1
                    n = server.attempts
                if server.dead:
                    return self._drop()
                if self.path != "/v1/completions":
                    return self._send(404, {"error": {"message": "not found"}})
                if n <= server.fail_first:
                    return self._send(503, {"error": {"message": "busy"}})
                if n <= server.fail_first + server.drop_next:
                    return self._drop()
                ids = body.get("prompt")
                if (not isinstance(ids, list) or not ids
                        or not all(isinstance(i, int) for i in ids)):
                    return self._send(400, {"error": {"message": "prompt: token ids expected"}})
                if body.get("model") != server.model_name:
                    return self._send(404, {"error": {"message": f"model {body.get('model')}"}})
                with server._lock:
                    # dying after `die_after` answers: a request beside the last one
                    # (concurrency > 1) is dropped too, never answered past the death
                    late = server.die_after is not None and server.taken >= server.die_after
                    server.taken += 0 if late else 1
                if late:
                    return self._drop()
                path = server._answer(ids)
                with server._lock:
                    server.answered.append(ids)
                    k = len(server.answered)
                self._send(200, {
                    "id": f"cmpl-{n}", "object": "text_completion", "created": int(time.time()),
                    "model": server.model_name,
                    "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                    "usage": {"prompt_tokens": len(ids), "completion_tokens": 1},
                    "kv_transfer_params": {"hidden_states_path": path}})
                if server.die_after is not None and k >= server.die_after:
                    server.die()

            def _drop(self) -> None:
                self.close_connection = True
                self.connection.close()

            def _send(self, code: int, obj: dict[str, Any]) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler

    def die(self) -> None:
        """Stop answering at once and close the listener (a crashed server)."""
        self.dead = True
        threading.Thread(target=self.close, daemon=True).start()

    def close(self) -> None:
        self.dead = True
        self.httpd.shutdown()
        self.httpd.server_close()
        self._jobs.put(None)
        self._writes.put(None)

    def files(self) -> list[str]:
        return sorted(os.listdir(self.storage))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--storage", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    s = VllmStandin(args.target, args.storage, port=args.port, threads=args.threads)
    print(s.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
