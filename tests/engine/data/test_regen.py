"""regen: turn-by-turn regeneration through a real OpenAI-compatible server backed by the target."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine_helpers import run_engine
from tests.openai_server import OpenAIServer

pytest_plugins = ("tests.demo_workspace",)

MAX_TOKENS = 24


def prompts(demo_dir: Path, n: int) -> list[dict]:
    lines = (demo_dir / "conversations" / "prompts.jsonl").read_text().splitlines()[:n]
    return [json.loads(line) for line in lines]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def server(demo_dir: Path) -> Iterator[OpenAIServer]:
    s = OpenAIServer(str(demo_dir / "target"), fail_first=2, drop_next=1)
    yield s
    s.close()


def regen_args(server: OpenAIServer, src: Path, out: Path, *extra: str) -> list[str]:
    return ["regen", "--endpoint", server.url, "--model", "demo", "--in", str(src),
            "--out", str(out), "--concurrency", "3", "--max-tokens", str(MAX_TOKENS), *extra]


def test_regen_replies_are_the_targets_turn_by_turn(demo_dir: Path, server: OpenAIServer,
                                                    tmp_path: Path) -> None:
    rows = prompts(demo_dir, 6)
    # ShareGPT spelling with a stale answer that must be replaced, and no id
    rows.append({"conversations": [{"from": "human", "value": "count from 2 to 5"},
                                   {"from": "gpt", "value": "STALE"},
                                   {"from": "human", "value": "spell the word lemon"}]})
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(src, rows)
    p = run_engine(*regen_args(server, src, out, "--events"), timeout=300)
    got = read_jsonl(out)
    assert len(got) == len(rows) and len({r["id"] for r in got}) == len(rows)
    assert {r["id"] for r in got} >= {r["id"] for r in rows if "id" in r}
    for r in got:
        turns = r["conversations"]
        assert [t["role"] for t in turns][::2] == ["user"] * ((len(turns) + 1) // 2)
        assert turns[-1]["role"] == "assistant" and "STALE" not in json.dumps(turns)
        for k, t in enumerate(turns):
            if t["role"] == "assistant":  # the reply to the conversation so far, own replies in
                assert t["content"] == server.reply(turns[:k], MAX_TOKENS)
    n_turns = sum(len(r["conversations"]) // 2 for r in got)
    assert len(server.requests) == n_turns and server.attempts == n_turns + 3  # 2 x 503, 1 drop
    evs = [json.loads(line) for line in p.stdout.splitlines()]
    assert evs[-1]["kind"] == "result" and evs[-1]["data"]["written"] == len(rows)
    prog = [e for e in evs if e["kind"] == "progress"]
    assert prog[-1]["done"] == prog[-1]["total"] == len(rows)


def test_regen_resumes_and_cuts_a_torn_line(demo_dir: Path, server: OpenAIServer,
                                            tmp_path: Path) -> None:
    rows = prompts(demo_dir, 5)
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(src, rows)
    done = [{"id": rows[0]["id"], "conversations": [{"role": "user", "content": "x"},
                                                    {"role": "assistant", "content": "kept"}]}]
    out.write_text(json.dumps(done[0]) + "\n" + '{"id": "' + rows[1]["id"] + '", "conv')
    run_engine(*regen_args(server, src, out), timeout=300)
    got = read_jsonl(out)
    assert [r["id"] for r in got].count(rows[0]["id"]) == 1 and got[0] == done[0]
    assert sorted(r["id"] for r in got) == sorted(r["id"] for r in rows)
    assert len(server.requests) == sum(len(r["conversations"]) for r in rows[1:])


def test_regen_failed_conversations_are_reported_and_retried(demo_dir: Path, tmp_path: Path
                                                             ) -> None:
    rows = prompts(demo_dir, 4)
    rows[2]["conversations"][0]["content"] = "FORBIDDEN " + rows[2]["conversations"][0]["content"]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_jsonl(src, rows)
    bad = OpenAIServer(str(demo_dir / "target"), reject_word="FORBIDDEN")
    try:
        p = run_engine(*regen_args(bad, src, out), check=False, timeout=300)
    finally:
        bad.close()
    assert p.returncode == 1
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"error: 1 of 4 conversations failed (first: {rows[2]['id']!r}: HTTP 400"), last
    # the server's own message, not its JSON
    assert ": prompt rejected); rerun" in last and '{"error"' not in last, last
    assert rows[2]["id"] not in {r["id"] for r in read_jsonl(out)} and len(read_jsonl(out)) == 3
    good = OpenAIServer(str(demo_dir / "target"))
    try:
        run_engine(*regen_args(good, src, out), timeout=300)
    finally:
        good.close()
    assert len(good.requests) == len(rows[2]["conversations"])  # only the failed one again
    assert sorted(r["id"] for r in read_jsonl(out)) == sorted(r["id"] for r in rows)


def test_regen_bad_endpoint_is_one_line(demo_dir: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    write_jsonl(src, prompts(demo_dir, 1))
    p = run_engine("regen", "--endpoint", "ftp://x", "--model", "m", "--in", str(src),
                   "--out", str(tmp_path / "o.jsonl"), check=False)
    assert p.returncode == 1 and p.stderr.strip() == (
        "error: --endpoint ftp://x: must start with http:// or https://")
    assert not (tmp_path / "o.jsonl").exists()
