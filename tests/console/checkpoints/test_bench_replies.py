"""`bench` against a server on 127.0.0.1 that answers in shapes vLLM never does: every
malformed answer is one worded line naming the request and the field (exit 1, no traceback);
prompt files that are nested too deep, not regular files, or endless are refused by name. A
server that reports another drafter than this workstation's records is benched under the
drafter the server names, and the disagreement is said."""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from console.cli import main as cli_main
from tests.serving_journal import record_session
from tests.vllm_metrics_standin import State, page

GOOD_REPLY = {"choices": [{"index": 0, "finish_reason": "stop", "token_ids": [5, 6],
                           "message": {"role": "assistant", "content": "hi"}}],
              "usage": {"prompt_tokens": 3, "completion_tokens": 2}, "prompt_token_ids": [1, 2]}


class FakeVllm:
    """/v1/models, /weight_info, /server_info, /metrics and /v1/chat/completions; `answers`
    replaces an answer's body (raw bytes) by path."""

    def __init__(self, answers: dict[str, bytes]) -> None:
        self.answers = answers
        self.tokens = 0
        self.bodies: list[Any] = []   # what each POST asked
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                self.reply(self.path.split("?")[0])

            def do_POST(self) -> None:  # noqa: N802
                fake.bodies.append(json.loads(
                    self.rfile.read(int(self.headers.get("Content-Length") or 0))))
                fake.tokens += 2
                self.reply(self.path)

            def reply(self, path: str) -> None:
                normal = {"/v1/models": json.dumps({"data": [{"id": "target", "root": "t"}]}),
                          "/weight_info": json.dumps({"weight_version": "default"}),
                          "/server_info": json.dumps({"vllm_config": {"speculative_config": {
                              "model": "/drafters/first"}}}),
                          "/metrics": page(State(drafts=fake.tokens, accepted=fake.tokens,
                                                 draft_tokens=3 * fake.tokens,
                                                 generation_tokens=fake.tokens)),
                          "/v1/chat/completions": json.dumps(GOOD_REPLY)}
                body = fake.answers.get(path, normal.get(path, "").encode())
                self.send_response(200 if path in normal else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def box(tmp_path: Path) -> Path:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[hosts.box]\npython = "{sys.executable}"\nroot = "{tmp_path / "root"}"\n')
    return cfg


def served(port: int, drafter: str = "/drafters/first") -> None:
    """The workstation's record of a `serve` on that port (swappable)."""
    record_session({"run_id": "serve-first-1", "host": "box", "drafter": drafter, "port": port,
                    "k": 3, "metrics": f"http://127.0.0.1:{port}/metrics", "started": 1.0,
                    "swappable": True})


def bench(cfg: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli_main(["--config", str(cfg), "bench", "box", *args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    p = tmp_path / "prompts.jsonl"
    p.write_text(json.dumps({"prompt": "hello"}) + "\n")
    return p


def _reply(**change: Any) -> bytes:
    doc = json.loads(json.dumps(GOOD_REPLY))
    for path, value in change.items():
        *head, last = path.split("__")
        d = doc
        for k in head:
            d = d[0] if k == "0" else d[k]
        d[last] = value
    return json.dumps(doc).encode()


MALFORMED = {
    "models-list": ("/v1/models", b'[{"id": "target"}]', "`answer` is a list"),
    "models-data-object": ("/v1/models", b'{"data": {"id": "target"}}', "`data` is an object"),
    "weight-info-list": ("/weight_info", b'["default"]', "GET /weight_info: no weight_version"),
    "choices-object": ("/v1/chat/completions", _reply(choices={"0": {}}),
                       "`choices` is an object"),
    "message-string": ("/v1/chat/completions",
                       _reply(choices=[{"message": "hi", "finish_reason": "stop"}]),
                       "`choices[0].message` is a string"),
    "usage-list": ("/v1/chat/completions", _reply(usage=[2]), "`usage` is a list"),
    "tokens-nan": ("/v1/chat/completions",
                   _reply(usage={"completion_tokens": 0}).replace(b'"completion_tokens": 0',
                                                                  b'"completion_tokens": NaN'),
                   "`usage.completion_tokens` is nan"),
    "tokens-text": ("/v1/chat/completions", _reply(usage={"completion_tokens": "eight"}),
                    "`usage.completion_tokens` is a string"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_answer_is_one_worded_line(box: Path, prompts: Path, case: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path, body, want = MALFORMED[case]
    fake = FakeVllm({path: body})
    try:
        served(fake.port)
        rc, out, err = bench(box, capsys, "--prompts", str(prompts))
    finally:
        fake.close()
    lines = err.strip().splitlines()
    assert rc == 1 and out == "" and len(lines) == 1, err
    assert want in lines[0] and path in lines[0], lines[0]


def test_the_server_names_the_drafter_not_the_workstations_records(
        box: Path, prompts: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Another console swapped `other` in: /weight_info says so, the records here do not."""
    fake = FakeVllm({"/weight_info": b'{"weight_version": "other@0123456789abcdef"}'})
    try:
        served(fake.port)
        rc, out, err = bench(box, capsys, "--prompts", str(prompts), "--json")
        assert rc == 0, err
        res = json.loads(out)
        # no swap recorded here wrote that version: named by its version, not a guessed folder
        assert (res["drafter"], res["weight_version"]) == ("other@0123456789abcdef",) * 2
        assert "records say" in res["records_disagree"] and \
            "(/drafters/first); the server says other@0123456789abcdef" in res["records_disagree"]
        rc, out, err = bench(box, capsys, "--prompts", str(prompts))
        assert rc == 0 and out.splitlines()[0].endswith(", other@0123456789abcdef"), out
        assert out.splitlines()[1] == "  acceptance length 2.000", out  # one accepted per draft
        assert "warning: this console's records say" in err and "/drafters/first" in err
        # `default`: the drafter the server started with, from its own speculative config
        fake.answers.clear()
        rc, out, err = bench(box, capsys, "--prompts", str(prompts), "--json")
        res = json.loads(out)
        assert rc == 0 and res["drafter"] == "/drafters/first" and res["weight_version"] == \
            "default" and res["records_disagree"] is None
    finally:
        fake.close()


def test_replies_stop_at_eos_unless_a_fixed_length_is_asked(
        box: Path, prompts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What the server is asked, and what the output says of it."""
    fake = FakeVllm({})
    seen = fake.bodies
    try:
        served(fake.port)
        rc, out, _ = bench(box, capsys, "--prompts", str(prompts), "--max-tokens", "48")
        assert rc == 0 and "1 prompts to EOS (at most 48 tokens; 2 generated)" in out, out
        assert "ignore_eos" not in seen[-1] and seen[-1]["max_tokens"] == 48
        rc, out, _ = bench(box, capsys, "--prompts", str(prompts), "--max-tokens", "48",
                           "--fixed-length")
        assert rc == 0 and "1 prompts x 48 tokens (fixed length, past EOS)" in out, out
        assert seen[-1]["ignore_eos"] is True
    finally:
        fake.close()


@pytest.mark.parametrize("case", ["nested", "fifo", "dev-zero", "directory"])
@pytest.mark.parametrize("where", ["--prompts", "--data"])
def test_prompt_files_that_cannot_be_read_whole_are_refused(
        box: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str,
        where: str) -> None:
    """A line nested 100k deep, a FIFO (would block), /dev/zero (endless), a folder: refused
    by name, before any request."""
    folder = tmp_path / "data"
    folder.mkdir()
    f = folder / "bad.jsonl"
    if case == "nested":
        f.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    elif case == "fifo":
        os.mkfifo(f)
    elif case == "dev-zero":
        f.symlink_to("/dev/zero")
    else:
        f.mkdir()
    served(1)  # never asked: the prompts are refused first
    rc, out, err = bench(box, capsys, where, str(f if where == "--prompts" else folder))
    lines = err.strip().splitlines()
    assert rc == 1 and len(lines) == 1, err
    want = {"nested": "bad.jsonl:1: not JSON (nested too deep)",
            "fifo": "not a regular file", "dev-zero": "not a regular file",
            "directory": "not a regular file"}[case]
    assert want in lines[0] and "bad.jsonl" in lines[0], lines[0]


def test_data_is_read_only_as_far_as_n_prompts(box: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """-n 2 from a folder whose first file has 2 good lines and the second garbage: the
    garbage is never read."""
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.jsonl").write_text("\n".join(json.dumps({"prompt": f"p{i}"})
                                              for i in range(2)) + "\n")
    (folder / "b.jsonl").write_text("not json\n")
    fake = FakeVllm({})
    try:
        served(fake.port)
        rc, out, err = bench(box, capsys, "--data", str(folder), "-n", "2", "--json")
    finally:
        fake.close()
    assert rc == 0 and json.loads(out)["prompts"] == 2, err
