"""One sample's target features from a vLLM server running hidden-state extraction.

The protocol (vLLM's ExampleHiddenStatesConnector; docs/eagle3.md#the-hidden-states-connector):
1. `POST /v1/completions` with `prompt` = the sample's token ids and `max_tokens` 1. The answer
   carries `kv_transfer_params.hidden_states_path`: PATH, a safetensors file the server writes
   asynchronously, holding `hidden_states` [T, L, H] (L = the server's layer ids, ascending; see
   engine/capture/server.py) and `token_ids` [T].
2. The server holds an exclusive flock on `PATH.lock` until the file is complete: take a shared
   flock on it (when it exists) before reading.
3. Check that `token_ids` are the ids sent, the shape is [T, L, H] and every value is finite; pick
   the aux slots (concatenated low|mid|high) and apply the target's final norm to the final slot
   (engine/ckpt/final_norm.py), so the features mean what the transformers path stores.
4. The client deletes PATH and PATH.lock once it no longer needs them.

The server names the file, so the server could name any file: PATH is used only when, symlinks
resolved, it lies inside the capture storage directory the client was told (`--server-storage`,
the capture server's `--storage`; `ServerStorage`). Any other path is refused by name, neither
read nor deleted, and a file that failed the checks of step 3 is left where it is.

Each request ends within the client's timeout and its answer is capped in size
(engine/bounded_http.py). Connection errors, timeouts and HTTP 408/409/425/429/5xx are retried
with exponential backoff and jitter; `max_failures` failures in a row (across all threads; any
success resets the count) abort with one message naming the server and the last failure.
Anything else (HTTP 400, a wrong file, an answer over the cap) is an EngineError naming the
sample. Standard library HTTP only (http.client).
"""

from __future__ import annotations

import fcntl
import http.client
import json
import os
import queue
import random
import stat
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from engine.bounded_http import AnswerTooLarge, connection, error_reason, send
from engine.capture.server import DEFAULT_STORAGE, capture_layer_ids, slots
from engine.ckpt.final_norm import FinalNorm, load_final_norm
from engine.data.one_thread import one_thread
from engine.errors import EngineError

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class GiveUp(EngineError):
    """Too many failed requests in a row: the server is down or overloaded."""


class _Transient(Exception):
    """One failed attempt worth retrying."""


def server_root(url: str) -> str:
    """Accept `http://host:port`, `.../v1` or `.../v1/completions`; return the root."""
    u = url.rstrip("/")
    if not u.startswith(("http://", "https://")):
        raise EngineError(f"--from-vllm {url}: must start with http:// or https://")
    for suffix in ("/v1/completions", "/v1"):
        if u.endswith(suffix):
            u = u[: -len(suffix)]
    return u


class ServerStorage:
    """The capture server's storage directory, as this machine sees it: the only place whose
    files the client reads and deletes (module docstring)."""

    def __init__(self, path: str = DEFAULT_STORAGE) -> None:
        self.given = path
        self.real = os.path.realpath(path)

    def holds(self, path: str) -> bool:
        """Whether `path`, symlinks resolved, lies inside the storage directory."""
        real = os.path.realpath(path)
        return real != self.real and os.path.commonpath([real, self.real]) == self.real

    def check(self, path: str, what: str) -> str:
        """`path` resolved, or an EngineError naming it when it lies outside the storage."""
        if not os.path.isabs(path) or not self.holds(path):
            raise EngineError(
                f"{what}: the server named {path} as its file, which is not inside the capture "
                f"storage directory {self.given} (--server-storage: the capture server's "
                "--storage); refused: not read, not deleted")
        return os.path.realpath(path)

    def remove(self, path: str, keep: bool = False) -> bool:
        """Delete PATH.lock, and PATH unless kept (the connector protocol leaves this to
        clients), only when PATH lies inside the storage; False when it does not."""
        if not self.holds(path):
            return False
        real = os.path.realpath(path)
        for p in (real + ".lock",) if keep else (real + ".lock", real):
            try:
                os.remove(p)  # never follows a symlink: a link is removed, not its target
            except FileNotFoundError:
                pass
        return True


@dataclass
class FeatureSpec:
    """How to turn a server file into the drafter's features for one target."""

    layer_ids: list[int]
    aux_slots: list[int]
    final_slot: int
    hidden_size: int
    norm: FinalNorm

    @classmethod
    def for_target(cls, target_dir: str, cfg: dict[str, Any], aux_ids: list[int]) -> FeatureSpec:
        n = int(cfg["num_hidden_layers"])
        aux_slots, final_slot = slots(aux_ids, n)
        return cls(layer_ids=capture_layer_ids(aux_ids, n), aux_slots=aux_slots,
                   final_slot=final_slot, hidden_size=int(cfg["hidden_size"]),
                   norm=load_final_norm(target_dir, cfg))


def read_features(path: str, sid: str, sent: list[int], spec: FeatureSpec
                  ) -> tuple[Tensor, Tensor]:
    """(aux [T, 3H], hidden [T, H] after the final norm) from the server's file, checked."""
    from safetensors.torch import load_file
    lock = path + ".lock"
    try:
        lf = open(lock)  # noqa: SIM115 (held across the read below)
    except FileNotFoundError:
        lf = None
    try:
        if lf is not None:
            fcntl.flock(lf, fcntl.LOCK_SH)  # sleeps until the server's write is complete
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise EngineError(f"sample {sid!r}: the server's file {path} is not visible here (run "
                              "the capture on the server's host, or share its --storage "
                              "directory at the same path)") from None
        if not stat.S_ISREG(mode):  # a FIFO would block the read, a directory fail it
            raise EngineError(f"sample {sid!r}: the server's file {path} is not a regular file")
        try:
            data = load_file(path)
        except Exception as e:  # a torn or foreign file: safetensors raises its own type
            raise EngineError(f"sample {sid!r}: cannot read the server's file {path} "
                              f"({str(e).splitlines()[0][:160]})") from None
    finally:
        if lf is not None:
            lf.close()
    hs, tid = data.get("hidden_states"), data.get("token_ids")
    if hs is None or tid is None:
        raise EngineError(f"sample {sid!r}: {path} lacks the 'hidden_states' or 'token_ids' "
                          "tensor")
    got = tid.reshape(-1).tolist()
    if got != sent:
        k = next((i for i, (a, b) in enumerate(zip(sent, got, strict=False)) if a != b),
                 min(len(sent), len(got)))
        was = sent[k] if k < len(sent) else "nothing"
        now = got[k] if k < len(got) else "nothing"
        raise EngineError(
            f"sample {sid!r}: the server's file {path} holds other token ids than were sent "
            f"({len(got)} ids for {len(sent)}; first difference at position {k}: sent {was}, "
            f"file {now})")
    want = (len(sent), len(spec.layer_ids), spec.hidden_size)
    if tuple(hs.shape) != want:
        raise EngineError(f"sample {sid!r}: hidden_states in {path} is {list(hs.shape)}, expected "
                          f"{list(want)} (layer ids {spec.layer_ids}); start the server with "
                          "`python -m engine capture-server --target TARGET`")
    finite = torch.isfinite(hs)
    if not bool(finite.all()):
        t, layer, _ = (~finite).nonzero()[0].tolist()
        raise EngineError(f"sample {sid!r}: non-finite values in hidden_states of {path} "
                          f"(position {t}, layer id {spec.layer_ids[layer]})")
    aux = torch.cat([hs[:, s] for s in spec.aux_slots], dim=-1)
    return aux, spec.norm(hs[:, spec.final_slot])


class DaemonPool:
    """Worker threads that never hold the process open (a blocked HTTP read can't be cancelled)."""

    _all: weakref.WeakSet[threading.Thread] = weakref.WeakSet()  # every pool's threads

    def __init__(self, workers: int, name: str = "vllm-client") -> None:
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(workers)]
        DaemonPool._all.update(self._threads)
        for t in self._threads:
            t.start()

    @staticmethod
    def any_alive() -> bool:
        """Whether a worker of any pool is still running (engine/__main__.py exits hard then)."""
        return any(t.is_alive() for t in DaemonPool._all)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        self._q.put((fut, fn, args))
        return fut

    def _work(self) -> None:
        one_thread()  # its checks and norm stay out of the caller's (or the server's) team
        while True:
            item = self._q.get()
            if item is None:
                return
            fut, fn, args = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # handed to whoever waits on the future
                fut.set_exception(e)

    def close(self, wait: bool = False) -> None:
        """Stop the workers; with `wait`, join them (idle ones exit at once), so no thread is
        still inside native code while the interpreter shuts down."""
        for _ in self._threads:
            self._q.put(None)
        if wait:
            end = time.monotonic() + 10  # a request still in flight is not waited for longer
            for t in self._threads:
                t.join(timeout=max(0.0, end - time.monotonic()))


class VllmClient:
    """The completions endpoint of one vLLM server (thread-safe)."""

    def __init__(self, url: str, model: str | None = None, timeout: float = 3600.0,
                 max_failures: int = 10, backoff: float = 0.2, max_backoff: float = 15.0,
                 storage: ServerStorage | None = None) -> None:
        if max_failures < 1:
            raise EngineError(f"--max-failures {max_failures}: must be >= 1")
        self.root = server_root(url)
        self.storage = storage or ServerStorage()
        self.model = model
        self.timeout = timeout
        self.max_failures = max_failures
        self.backoff, self.max_backoff = backoff, max_backoff
        self.api_key = os.environ.get("VLLM_API_KEY")  # read, never written anywhere
        self._lock = threading.Lock()
        self._failures = 0
        self.stopped = threading.Event()  # set on abort: other threads stop retrying
        self._prefix = urllib.parse.urlsplit(self.root).path
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPConnection:
        """This thread's keep-alive connection (a new TCP connection per request costs more
        than a small sample's features on a fast server)."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = connection(self.root, self.timeout)
        return conn

    def _call(self, path: str, body: dict[str, Any] | None, what: str) -> Any:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode()
        try:  # the whole request within `timeout`, the answer within MAX_ANSWER_BYTES
            ans = send(self._conn(), "GET" if body is None else "POST", self._prefix + path,
                       data, headers, self.timeout)
        except AnswerTooLarge as e:
            raise EngineError(f"{what}: {self.root}{path}: {e}") from None
        except (OSError, http.client.HTTPException) as e:  # refused, reset, timed out, torn
            raise _Transient(str(e) or type(e).__name__) from None
        raw, status = ans.body, ans.status
        if status >= 400:
            if status in RETRY_STATUS:
                raise _Transient(f"HTTP {status}")
            detail = error_reason(raw, 300)
            raise EngineError(f"{what}: HTTP {status} from {self.root}{path}: {detail}")
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            raise EngineError(f"{what}: the answer from {self.root}{path} is not JSON") from None

    def call(self, path: str, body: dict[str, Any] | None, what: str) -> Any:
        """One request, retried (module docstring)."""
        attempt = 0
        while True:
            try:
                out = self._call(path, body, what)
            except _Transient as e:
                with self._lock:
                    self._failures += 1
                    n = self._failures
                if n >= self.max_failures or self.stopped.is_set():
                    self.stopped.set()
                    raise GiveUp(f"{self.root}: {n} requests failed in a row (last: {what}: {e}); "
                                 "is the vLLM server up?") from None
                time.sleep(min(self.max_backoff, self.backoff * 2 ** attempt)
                           * (0.5 + random.random()))
                attempt += 1
                continue
            with self._lock:
                self._failures = 0
            return out

    def served_model(self) -> str:
        """`model` if the server serves it, else the server's first model."""
        obj = self.call("/v1/models", None, "GET /v1/models")
        names = [m.get("id") for m in (obj.get("data") or []) if isinstance(m, dict)]
        if not names:
            raise EngineError(f"{self.root}/v1/models: the server lists no model")
        if self.model is None:
            self.model = str(names[0])
        elif self.model not in names:
            raise EngineError(f"--model {self.model}: not served by {self.root} (it serves "
                              f"{', '.join(map(str, names))})")
        return self.model

    def request(self, sid: str, ids: list[int]) -> str:
        """Ask for sample `sid`'s hidden states; returns the server's file path, resolved and
        inside the storage directory (`ServerStorage.check`)."""
        body = {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0}
        obj = self.call("/v1/completions", body, f"sample {sid!r}")
        path = (obj.get("kv_transfer_params") or {}).get("hidden_states_path") \
            if isinstance(obj, dict) else None
        if not isinstance(path, str) or not path:
            raise EngineError(f"sample {sid!r}: the answer of {self.root} has no "
                              "kv_transfer_params.hidden_states_path: is it serving with "
                              "hidden-state extraction? (python -m engine capture-server)")
        return self.storage.check(path, f"sample {sid!r}")
