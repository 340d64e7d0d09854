"""A stand-in for a vLLM server's Prometheus endpoint: a real HTTP server on 127.0.0.1 serving
the text format with vLLM's metric names (as prometheus_client writes them: HELP/TYPE lines,
`_total` samples, `_created` series, label sets per engine, histograms around them).

The test owns the counters: `set(...)` changes them at once, `schedule([...])` hands the states
out one per request (the last one repeats), so a scrape sees exactly the state the test chose,
however fast or slow the scraper is. A state whose counters are lower than the previous one's
is a server restart. `stop()` makes the server go away (the port then refuses connections).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil

MODEL = "demo/eagle3-target"


@dataclass(frozen=True)
class State:
    """The figures one /metrics page shows (counters since the server started)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_position: tuple[int, ...] = ()
    generation_tokens: int = 0
    prompt_tokens: int = 0
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0        # fraction 0-1, as vLLM exports it
    extra: dict[str, float] = field(default_factory=dict)


def page(s: State, *, legacy_kv: bool = False, engines: int = 1, histograms: int = 6) -> str:
    """The text vLLM (v1 engine) serves for s. legacy_kv: the pre-0.9 KV-cache gauge name.
    engines > 1: the counters split across engine label sets (data parallel), as vLLM does.
    histograms: how many request histograms pad the page (a real page has ~10, ~500 lines)."""
    out: list[str] = []

    def family(name: str, kind: str, help_: str, values: list[tuple[str, float]]) -> None:
        full = f"{name}_total" if kind == "counter" else name
        out.append(f"# HELP {full} {help_}")
        out.append(f"# TYPE {full} {kind}")
        for labels, v in values:
            out.append(f"{full}{{{labels}}} {float(v)!r}")
        if kind == "counter":
            out.append(f"# HELP {name}_created {help_}")
            out.append(f"# TYPE {name}_created gauge")
            for labels, _ in values:
                out.append(f"{name}_created{{{labels}}} 1.764547e+09")

    def split(v: float, whole: bool = True) -> list[tuple[str, float]]:
        # engine e gets its share; the shares add up to v exactly
        parts = [(v // engines if whole else v / engines) for _ in range(engines)]
        parts[0] += v - sum(parts)
        return [(f'engine="{e}",model_name="{MODEL}"', p) for e, p in enumerate(parts)]

    family("vllm:num_requests_running", "gauge", "Number of requests in model execution "
           "batches.", split(s.running))
    family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
           split(s.waiting))
    kv = "vllm:gpu_cache_usage_perc" if legacy_kv else "vllm:kv_cache_usage_perc"
    family(kv, "gauge", "KV-cache usage. 1 means 100 percent usage.",
           [(f'engine="{e}",model_name="{MODEL}"', s.kv_cache_usage) for e in range(engines)])
    family("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.",
           split(s.prompt_tokens))
    family("vllm:generation_tokens", "counter", "Number of generation tokens processed.",
           split(s.generation_tokens))
    family("vllm:spec_decode_num_drafts", "counter", "Number of spec decoding drafts.",
           split(s.drafts))
    family("vllm:spec_decode_num_draft_tokens", "counter", "Number of draft tokens.",
           split(s.draft_tokens))
    family("vllm:spec_decode_num_accepted_tokens", "counter", "Number of accepted tokens.",
           split(s.accepted))
    family("vllm:spec_decode_num_accepted_tokens_per_pos", "counter",
           "Accepted tokens per draft position.",
           [(f'engine="0",model_name="{MODEL}",position="{i}"', v)
            for i, v in enumerate(s.per_position)])
    for name, v in s.extra.items():
        family(name, "gauge", "extra", [(f'model_name="{MODEL}"', v)])
    buckets = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
    for h in range(histograms):
        name = f"vllm:request_histogram_{h}_seconds"
        out.append(f"# HELP {name} Histogram of something about requests.")
        out.append(f"# TYPE {name} histogram")
        for e in range(engines):
            labels = f'engine="{e}",model_name="{MODEL}"'
            for i, b in enumerate(buckets):
                out.append(f'{name}_bucket{{{labels},le="{b}"}} {float(i * s.drafts)!r}')
            out.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(len(buckets) * s.drafts)!r}')
            out.append(f"{name}_count{{{labels}}} {float(len(buckets) * s.drafts)!r}")
            out.append(f"{name}_sum{{{labels}}} {float(s.generation_tokens) / 7!r}")
    return "\n".join(out) + "\n"


def _owner(client: tuple[str, int]) -> str:
    """The name of the local process whose socket is this client address (the sshd serving
    a direct-tcpip channel, or the console itself for the local host)."""
    for c in psutil.net_connections(kind="tcp"):
        if c.laddr and (c.laddr.ip, c.laddr.port) == client[:2] and c.pid:
            try:
                return psutil.Process(c.pid).name()
            except psutil.NoSuchProcess:
                return "?"
    return "?"


class VllmMetricsStandin:
    """The HTTP server. `url` is what a host config's `metrics` points at."""

    def __init__(self, state: State | None = None, *, legacy_kv: bool = False,
                 engines: int = 1, chunked: bool = False, histograms: int = 6,
                 port: int = 0) -> None:
        self._lock = threading.Lock()
        self._state = state or State()
        self._queue: list[State] = []
        self.legacy_kv, self.engines, self.chunked = legacy_kv, engines, chunked
        self.histograms = histograms
        self.requests = 0
        self.status = 200                 # what /metrics answers with (503: not up yet)
        self.hang = threading.Event()     # set: requests get no answer until stop()
        self._stopping = threading.Event()
        self.peers: list[str] = []        # the process that connected, per request
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                standin.peers.append(_owner(self.client_address))
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                if standin.hang.is_set():
                    standin._stopping.wait(30)
                    return
                if standin.status != 200:
                    self.send_error(standin.status)
                    return
                body = standin._next_page().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                if standin.chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for i in range(0, len(body), 4096):
                        part = body[i:i + 4096]
                        self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                    self.wfile.write(b"0\r\n\r\n")
                else:
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _next_page(self) -> str:
        with self._lock:
            if self._queue:
                self._state = self._queue.pop(0)
            self.requests += 1
            state = self._state
        return page(state, legacy_kv=self.legacy_kv, engines=self.engines,
                    histograms=self.histograms)

    def set(self, **changes: object) -> None:
        """Change the figures every later request sees."""
        with self._lock:
            self._queue.clear()
            self._state = replace(self._state, **changes)  # type: ignore[arg-type]

    def schedule(self, states: Sequence[State]) -> None:
        """Serve these states one per request, in order; the last one then stays."""
        with self._lock:
            self._queue = list(states)

    def stop(self) -> None:
        """Go away: the listening socket closes, so connections are refused."""
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def serving(step: int) -> State:
    """A server that has answered `step` rounds of drafting: 100 drafts of k=3 per round with
    240 accepted (0.9, 0.8, 0.7 per position), so every interval reads acceptance length 3.4."""
    return State(drafts=100 * step, draft_tokens=300 * step, accepted=240 * step,
                 per_position=(90 * step, 80 * step, 70 * step),
                 generation_tokens=500 * step, running=1)


if __name__ == "__main__":
    # `python -m tests.vllm_metrics_standin PORT`: serve /metrics on 127.0.0.1:PORT until killed,
    # one drafting round more per scrape (the stand-in `vllm serve` of
    # tests/console/checkpoints/test_serve.py) (a test that serves its own figures on that port
    # already: then only wait to be stopped)
    import sys
    import time
    try:
        srv = VllmMetricsStandin(serving(1), port=int(sys.argv[1]))
        srv.schedule([serving(n) for n in range(1, 1000)])
    except OSError:  # the port is taken
        pass
    while True:
        time.sleep(3600)
