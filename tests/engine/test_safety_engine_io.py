"""What a server or a file can make the engine do to a user's files.

Hostile servers on 127.0.0.1 (a capture server naming files of the user's, a chat server that
answers one byte a second or without end), crafted output files and a real `python -m engine`
subprocess: nothing outside what the engine wrote is deleted, nothing is cut off, no request
outlives its deadline or grows without bound.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.engine_helpers import run_engine, train_args

pytest_plugins = ("tests.demo_workspace",)

MAX_LEN = "512"


class FakeServer:
    """An HTTP server on 127.0.0.1: GET /v1/models lists model "m"; every POST is answered by
    `post(handler, body)` (which writes the whole answer itself)."""

    def __init__(self, post: Callable[[BaseHTTPRequestHandler, dict[str, Any]], None]) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                send_json(self, {"object": "list", "data": [{"id": "m", "object": "model"}]})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                try:
                    post(self, body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up: what these tests want

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def send_json(h: BaseHTTPRequestHandler, obj: Any) -> None:
    data = json.dumps(obj).encode()
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


@pytest.fixture
def serve() -> Iterator[Callable[..., FakeServer]]:
    started: list[FakeServer] = []

    def start(post: Callable[[BaseHTTPRequestHandler, dict[str, Any]], None]) -> FakeServer:
        started.append(FakeServer(post))
        return started[-1]

    yield start
    for s in started:
        s.close()


def naming(path: Path) -> Callable[[BaseHTTPRequestHandler, dict[str, Any]], None]:
    """A capture server whose every answer names `path` as its hidden-states file."""
    def post(h: BaseHTTPRequestHandler, _body: dict[str, Any]) -> None:
        send_json(h, {"choices": [{"text": ""}],
                      "kv_transfer_params": {"hidden_states_path": str(path)}})
    return post


def user_files(tmp_path: Path) -> list[Path]:
    """A user's file and the `.lock` beside it, which a client deleting PATH.lock would take."""
    home = tmp_path / "home"
    home.mkdir()
    notes = home / "notes.safetensors"
    notes.write_text("the user's own notes\n")
    (home / "notes.safetensors.lock").write_text("mine too\n")
    return [notes, home / "notes.safetensors.lock"]


def small_convs(demo_dir: Path, tmp_path: Path, n: int = 4) -> Path:
    lines = (demo_dir / "conversations" / "train.jsonl").read_text().splitlines()[:n]
    p = tmp_path / "conv.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def last_error(p: Any) -> str:
    assert p.returncode == 1, (p.returncode, p.stderr[-2000:])
    return str(p.stderr.strip().splitlines()[-1])


# -- 1. a capture server chooses which file the engine deletes ---------------------------------

@pytest.mark.slow
def test_train_online_never_deletes_a_file_the_server_names_outside_its_storage(
        serve: Any, demo_dir: Path, tmp_path: Path) -> None:
    files = user_files(tmp_path)
    storage = tmp_path / "hs"
    storage.mkdir()
    link = storage / "cmpl-1.safetensors"  # inside the storage by name, outside once resolved
    link.symlink_to(files[0])
    for named in (files[0], link):
        s = serve(naming(named))
        args = train_args(demo_dir, tmp_path / f"run-{named.name}", "--max-steps", "1",
                          "--holdout", "0", "--online", "--max-len", MAX_LEN, "--from-vllm",
                          s.url, "--server-storage", str(storage))
        args[args.index("--data") + 1] = str(small_convs(demo_dir, tmp_path))
        line = last_error(run_engine(*args, check=False))
        assert f"the server named {named} as its file, which is not inside the capture " \
               f"storage directory {storage}" in line, line
        assert "refused: not read, not deleted" in line
        assert [f.read_text() for f in files] == ["the user's own notes\n", "mine too\n"]
        assert link.is_symlink()


def test_train_online_keeps_a_server_file_that_fails_its_checks(
        serve: Any, demo_dir: Path, tmp_path: Path) -> None:
    storage = tmp_path / "hs"
    storage.mkdir()
    bad = storage / "cmpl-1.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")  # not the features asked for
    s = serve(naming(bad))
    args = train_args(demo_dir, tmp_path / "run", "--max-steps", "1", "--holdout", "0",
                      "--online", "--max-len", MAX_LEN, "--from-vllm", s.url,
                      "--server-storage", str(storage))
    args[args.index("--data") + 1] = str(small_convs(demo_dir, tmp_path))
    line = last_error(run_engine(*args, check=False))
    assert str(bad) in line and "lacks the 'hidden_states' or 'token_ids' tensor" in line, line
    assert bad.is_file()  # a file that failed validation is not deleted


@pytest.mark.slow
def test_prepare_from_vllm_deletes_no_named_or_journalled_file_outside_its_storage(
        serve: Any, demo_dir: Path, tmp_path: Path) -> None:
    """The server names a user's file, then a file of its storage that fails the checks; a
    rerun (which reads pending.jsonl) deletes neither, nor a user's file the journal names."""
    files = user_files(tmp_path)
    storage = tmp_path / "hs"
    storage.mkdir()
    bad = storage / "cmpl-1.safetensors"
    bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    named = [files[0]]
    s = serve(lambda h, body: naming(named[0])(h, body))
    out = tmp_path / "data"
    args = ("prepare", "--target", str(demo_dir / "target"), "--data",
            str(small_convs(demo_dir, tmp_path)), "--out", str(out), "--max-len", MAX_LEN,
            "--from-vllm", s.url, "--server-storage", str(storage), "--concurrency", "1")
    for _ in range(2):
        line = last_error(run_engine(*args, check=False))
        assert f"the server named {files[0]} as its file, which is not inside" in line, line
        assert [f.read_text() for f in files] == ["the user's own notes\n", "mine too\n"]
    named[0] = bad
    for _ in range(2):  # the second run finds it in pending.jsonl and reads it again
        line = last_error(run_engine(*args, check=False))
        assert f"{bad} lacks the 'hidden_states' or 'token_ids' tensor" in line, line
        assert bad.is_file()
    journal = tmp_path / "data.partial" / "pending.jsonl"
    entry = json.loads(journal.read_text().splitlines()[0])
    journal.write_text(json.dumps({**entry, "path": str(files[0])}) + "\n")
    p = run_engine(*args, check=False)
    assert f"{files[0]} is not inside the capture storage directory {storage}" in p.stderr
    assert [f.read_text() for f in files] == ["the user's own notes\n", "mine too\n"]


# -- 2. `prepare --overwrite` deletes whatever --out names -------------------------------------

@pytest.mark.slow
def test_prepare_overwrite_refuses_an_out_tied_to_an_input_or_not_a_data_dir(
        demo_dir: Path, tmp_path: Path) -> None:
    import shutil
    target = tmp_path / "target"
    shutil.copytree(demo_dir / "target", target)
    before = sorted(p.name for p in target.iterdir())
    work = tmp_path / "work"
    work.mkdir()
    convs = small_convs(demo_dir, work)
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me\n")

    def prepare(out: Path, *extra: str) -> Any:
        return run_engine("prepare", "--target", str(target), "--data", str(convs), "--out",
                          str(out), "--max-len", MAX_LEN, "--overwrite", *extra, check=False)

    cases = [(target, f"{target}: is the target {target}"),
             (target / "sub", f"{target / 'sub'}: is inside the target {target}"),
             (work, f"{work}: contains the data {convs} (--overwrite would delete it"),
             (convs, f"{convs}: is the data {convs}"),
             (folder, f"{folder}: not replaced, it holds notes.txt, which does not belong in a "
                      "prepared-data directory; --overwrite replaces only a prepared-data "
                      "directory (manifest.json and shard_*.safetensors, nothing else)")]
    for out, want in cases:
        line = last_error(prepare(out))
        assert line == f"error: {want}" or line.startswith(f"error: {want}"), (out, line)
    assert sorted(p.name for p in target.iterdir()) == before
    assert (folder / "notes.txt").read_text() == "keep me\n" and convs.is_file()
    # OUT.partial, where prepare works, is started afresh only when it holds prepare's files
    (tmp_path / "other.partial").mkdir()
    (tmp_path / "other.partial" / "notes.txt").write_text("keep me\n")
    line = last_error(prepare(tmp_path / "other"))
    assert line.startswith(f"error: {tmp_path / 'other.partial'}: not removed, it holds "
                           "notes.txt, which does not belong in a partial data directory"), line
    assert (tmp_path / "other.partial" / "notes.txt").read_text() == "keep me\n"
    # a data directory (and an empty folder) is replaced
    data = tmp_path / "data"
    data.mkdir()
    for _ in range(2):
        p = prepare(data, "--json")
        assert p.returncode == 0, p.stderr[-2000:]
        assert json.loads(p.stdout)["samples"] == 4
    assert (data / "manifest.json").is_file()


# -- 3. `regen` truncates its --out at the first line it cannot parse ---------------------------

def chat_reply(h: BaseHTTPRequestHandler, _body: dict[str, Any]) -> None:
    send_json(h, {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]})


def conv(i: int, reply: str | None = None) -> str:
    turns = [{"role": "user", "content": f"question {i}"}]
    if reply is not None:
        turns.append({"role": "assistant", "content": reply})
    return json.dumps({"id": f"c{i}", "conversations": turns}) + "\n"


def regen(url: str, src: Path, out: Path, *extra: str) -> Any:
    return run_engine("regen", "--endpoint", url, "--model", "m", "--in", str(src), "--out",
                      str(out), "--retries", "0", *extra, check=False)


def test_regen_cuts_only_a_torn_last_line_and_refuses_other_bad_lines(
        serve: Any, tmp_path: Path) -> None:
    s = serve(chat_reply)
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(conv(i) for i in range(8)))
    kept = conv(0, "a") + "\n" + conv(1, "b") + conv(2, "c")
    out.write_text(kept + '{"id": "c3", "conv')  # a blank line (harmless) and a torn last line
    p = regen(s.url, src, out)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = out.read_text().splitlines()
    assert out.read_text().startswith(kept) and len([x for x in lines if x]) == 8
    assert sorted(json.loads(x)["id"] for x in lines if x) == [f"c{i}" for i in range(8)]
    ok = [conv(0, "a"), conv(1, "b"), conv(2, "c")]
    for lines, n, why in [([ok[0], '{"note": "mine"}\n', *ok[1:]], 2, "no conversation id"),
                          ([ok[0], "not json\n", *ok[1:]], 2, "invalid JSON"),
                          ([*ok, '{"id": "c9"}\n'], 4, "field 'conversations': missing")]:
        text = "".join(lines)
        out.write_text(text)
        line = last_error(regen(s.url, src, out))
        assert line.startswith(f"error: {out}:{n}: ") and why in line, line
        assert line.endswith("regen only ever cuts an unterminated last line)"), line
        assert out.read_text() == text  # nothing cut, nothing appended


def test_regen_refuses_an_out_that_is_its_in(serve: Any, tmp_path: Path) -> None:
    s = serve(chat_reply)
    src = tmp_path / "in.jsonl"
    text = "".join(json.dumps({"conversations": [{"role": "user", "content": f"q{i}"}]}) + "\n"
                   for i in range(20))  # no ids: the old code cut this file to 0 bytes
    src.write_text(text)
    (tmp_path / "link.jsonl").symlink_to(src)
    (tmp_path / "hard.jsonl").hardlink_to(src)
    for out in (src, tmp_path / "link.jsonl", tmp_path / "hard.jsonl"):
        line = last_error(regen(s.url, src, out))
        assert line == (f"error: --out {out}: is the --in file {src} (regen appends to --out as "
                        "it goes); choose another --out"), line
        assert src.read_text() == text


# -- 6. HTTP clients without bounds -------------------------------------------------------------

def dripping(h: BaseHTTPRequestHandler, _body: Any = None) -> None:
    """An answer of one byte a second (each read returns in time: only a deadline ends it)."""
    data = json.dumps({"choices": [{"message": {"content": "x" * 200}}], "data": []}).encode()
    h.send_response(200)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    for b in data:
        h.wfile.write(bytes([b]))
        h.wfile.flush()
        time.sleep(1.0)


def endless(h: BaseHTTPRequestHandler, _body: Any = None, declared: bool = False) -> None:
    """A 200 answer that never ends (stopped at 100 MiB so the old client does not exhaust the
    shared machine); with `declared`, it says 16 GiB up front."""
    h.send_response(200)
    if declared:
        h.send_header("Content-Length", str(16 << 30))
    h.send_header("Connection", "close")
    h.end_headers()
    block = b" " * (1 << 20)
    for _ in range(100):
        h.wfile.write(block)


def test_regen_request_ends_by_its_timeout_and_its_answer_is_capped(
        serve: Any, tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(conv(0))
    s = serve(dripping)
    t0 = time.monotonic()
    line = last_error(regen(s.url, src, tmp_path / "out.jsonl", "--timeout", "2"))
    took = time.monotonic() - t0
    assert "giving up after 1 attempts (no complete answer within 2 s)" in line, line
    assert took < 15, took  # the process (python, imports) included; the old client: 200 s
    for declared in (True, False):
        s = serve(lambda h, b, d=declared: endless(h, b, d))
        line = last_error(regen(s.url, src, tmp_path / f"out-{declared}.jsonl"))
        want = ("is 17179869184 bytes, more than the 64 MiB allowed" if declared
                else "is longer than the 64 MiB allowed")
        assert f"{s.url}/v1/chat/completions: the answer {want}" in line, line


def test_capture_client_request_ends_by_its_deadline_and_its_answer_is_capped(
        serve: Any) -> None:
    """prepare --from-vllm and train --online share this client (engine/capture/vllm_client)."""
    from engine.capture.vllm_client import VllmClient
    from engine.errors import EngineError
    got: dict[str, Any] = {}

    def ask(url: str, key: str) -> None:
        t0 = time.monotonic()
        try:
            VllmClient(url, "m", timeout=2.0, max_failures=1).request("s1", [1, 2, 3])
        except EngineError as e:
            got[key] = (str(e), time.monotonic() - t0)

    for key, post in [("drip", dripping), ("endless", endless)]:
        s = serve(post)
        t = threading.Thread(target=ask, args=(s.url, key), daemon=True)
        t.start()
        t.join(20)
        assert key in got, f"{key}: the request was still running after 20 s"
    msg, took = got["drip"]
    assert "1 requests failed in a row (last: sample 's1': no complete answer within 2 s)" in msg
    assert took < 6, took  # the old client: every read in time, 200 s in all
    assert got["endless"][0].startswith("sample 's1': ") and "64 MiB allowed" in got["endless"][0]
