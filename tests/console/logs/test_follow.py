"""Following by byte offset: across forced disconnects of the real sshd no line is lost or
repeated; truncation and rotation; odd bytes; bounded memory; the logs and follow commands."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from console.cli import main as cli_main
from console.errors import CommandFailed
from console.hosts.host import HostPool
from console.logs.follow import MAX_LINE, Line, LogFollower
from console.logs.vllm_log import MARKERS, parse_line
from console.runs.service import launch
from console.settings.config import Config, HostConfig, Profile
from console.transport.local import LocalTransport
from console.transport.ssh import SSHTransport
from tests.sshd import SSHD

WRITER = """
import sys, time
path, n, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
with open(path, "a", buffering=1) as f:
    for i in range(n):
        f.write(f"line {i:07d} " + "x" * (i % 50) + "\\n")
        if i % 200 == 0:
            time.sleep(pause)
"""


def ssh_transport(sshd: SSHD) -> SSHTransport:
    return SSHTransport("box", sshd.target, known_hosts=str(sshd.known_hosts),
                        identity=str(sshd.user_key))


def numbers(lines: list[Line]) -> list[int]:
    return [int(ln.text.split()[1]) for ln in lines]


async def test_follow_across_forced_disconnects(sshd: SSHD, tmp_path: Path) -> None:
    log = tmp_path / "train log's.txt"
    log.write_text("")
    n = 30000
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(log), str(n), "0.01"])
    notices: list[str] = []
    transport = ssh_transport(sshd)
    got: list[Line] = []

    async def done() -> bool:
        return writer.poll() is not None

    follower = LogFollower(transport, str(log), start="begin", poll=0.05, chunk=64 * 1024,
                           until=done, on_notice=lambda k, d: notices.append(k))

    async def dropper() -> int:
        drops = 0
        while writer.poll() is None:
            await asyncio.sleep(0.3)
            drops += sshd.drop_connections() > 0
        return drops

    drop_task = asyncio.ensure_future(dropper())
    try:
        async for batch in follower.batches():
            got += batch
    finally:
        drops = await drop_task
        writer.wait()
        await transport.close()
    # the transport reconnects under the follower (its own backoff covers longer outages)
    assert drops >= 2
    assert numbers(got) == list(range(n))          # none lost, none repeated, in order
    offsets = [ln.offset for ln in got]
    assert offsets == sorted(offsets) and offsets[0] == 0
    with open(log, "rb") as f:                    # offsets are real byte offsets
        f.seek(got[12345].offset)
        assert f.readline().decode().rstrip("\n") == got[12345].text


@pytest.mark.parametrize("how", ["rename", "copytruncate", "truncate", "delete"])
async def test_rotation_and_truncation(how: str, tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("".join(f"old {i}\n" for i in range(5)))
    f = LogFollower(LocalTransport(), str(log), start="begin", poll=0.01)
    it = f.batches().__aiter__()
    assert [ln.text for ln in await it.__anext__()] == [f"old {i}" for i in range(5)]
    with open(log, "a") as fh:                     # written after our last read...
        fh.write("old 5\nold 6 unterminated")
    if how == "rename":                           # ...then rotated away
        os.rename(log, str(log) + ".1")
    elif how == "copytruncate":
        (tmp_path / "vllm.log.1").write_bytes(log.read_bytes())
        os.truncate(log, 0)
    elif how == "truncate":
        os.truncate(log, 0)
    else:
        log.unlink()
    with open(log, "a") as fh:
        fh.write("new 0\nnew 1\n")
    got: list[str] = []
    while len(got) < 2 or got[-1] != "new 1":
        got += [ln.text for ln in await asyncio.wait_for(it.__anext__(), 5)]
    f.stop()
    if how in ("rename", "copytruncate"):           # nothing lost: the old rest is drained
        assert got == ["old 5", "old 6 unterminated", "new 0", "new 1"]
    else:                                           # the bytes are gone; we restart cleanly
        assert got == ["new 0", "new 1"]


async def test_odd_bytes_long_lines_and_tail(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    long = "y" * 5000
    flood = b"z" * (MAX_LINE * 2 + 10)
    log.write_bytes(b"\x1b[32mgreen\x1b[0m\r\nbad \xff\xfe utf8\n" + long.encode() + b"\n" +
                    flood + b"\nlast")
    f = LogFollower(LocalTransport(), str(log), start="begin", follow=False)
    lines = [ln async for ln in f.lines()]
    assert lines[0].text == "\x1b[32mgreen\x1b[0m" and lines[0].plain == "green"
    assert lines[1].text == "bad \ufffd\ufffd utf8"
    assert lines[2].text == long and len(lines[2].display(100)) < 130
    pieces = [ln for ln in lines[3:] if ln.text.startswith("z")]
    assert "".join(p.text for p in pieces) == flood.decode()
    assert max(len(p.text) for p in pieces) <= MAX_LINE
    assert lines[-1].text == "last"
    for n, want in ((2, ["z" * 10] * 3 + ["last"]), (1, ["last"]), (0, [])):
        tail = LogFollower(LocalTransport(), str(log), tail_lines=n, follow=False)
        assert [ln.text[-10:] async for ln in tail.lines()] == want
    log.write_text("a\nb\nc\n")
    tail = LogFollower(LocalTransport(), str(log), tail_lines=2, follow=False)
    assert [ln async for ln in tail.lines()] == [Line(2, "b"), Line(4, "c")]
    tail = LogFollower(LocalTransport(), str(log), tail_lines=10, follow=False)
    assert [ln.text async for ln in tail.lines()] == ["a", "b", "c"]


async def test_memory_is_bounded(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    with open(log, "w") as fh:
        fh.writelines(f"INFO line {i} " + "q" * 80 + "\n" for i in range(120_000))  # ~11 MB
    f = LogFollower(LocalTransport(), str(log), start="begin", follow=False, chunk=128 * 1024)
    tracemalloc.start()
    count = 0
    async for batch in f.batches():
        count += len(batch)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert count == 120_000
    assert peak < 3 * 1024 * 1024, peak          # a chunk and its lines, not the file


VLLM = ("INFO 11-30 12:01:02 [loggers.py:123] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
        "Avg generation throughput: 2.0 tokens/s, Running: 3 reqs, Waiting: 0 reqs, "
        "GPU KV cache usage: 4.0%, Prefix cache hit rate: 5.0%\n"
        "INFO 11-30 12:01:02 [api_server.py:1] 127.0.0.1 POST /v1/completions 200\n"
        "\x1b[32mINFO\x1b[0m 11-30 12:01:02 [loggers.py:140] SpecDecoding metrics: Mean acceptance "
        "length: 2.84, Accepted: 1205 tokens, Drafted: 2100 tokens, Per-position acceptance rate: "
        "0.812, 0.601, 0.427, Avg Draft acceptance rate: 57.4%\n")


def test_logs_command(sshd: SSHD, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "vllm out.log"
    log.write_text("".join(f"n{i}\n" for i in range(20)) + VLLM)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[hosts.gpu]\nssh = "{sshd.target}"\npython = "{sys.executable}"\n'
                   f'known_hosts = "{sshd.known_hosts}"\nidentity = "{sshd.user_key}"\n')
    assert cli_main(["--config", str(cfg), "logs", "gpu", str(log), "--lines", "5"]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == ["n18", "n19"]
    assert cli_main(["--config", str(cfg), "logs", "gpu", str(log), "--metrics", "--json"]) == 0
    recs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["kind"] for r in recs] == ["engine", "spec_decode"]
    assert recs[1]["per_position"] == [0.812, 0.601, 0.427] and recs[0]["running"] == 3
    assert cli_main(["--config", str(cfg), "logs", "gpu", str(log), "--metrics"]) == 0
    assert "accept len 2.84" in capsys.readouterr().out
    assert cli_main(["--config", str(cfg), "logs", "gpu", str(tmp_path / "nope")]) == 1
    assert "no such file" in capsys.readouterr().err


async def test_follow_command_until_run_ends(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "talk.py"
    script.write_text("import time\nfor i in range(5):\n    print('tick', i, flush=True)\n"
                      "    time.sleep(0.3)\nraise SystemExit(2)\n")
    cfg = Config(hosts={"box": HostConfig(name="box", python=sys.executable,
                                          root=str(tmp_path / "root"))},
                 profiles={"talk": Profile(name="talk", hosts=["box"], run=f"python {script}")})
    pool = HostPool(cfg)
    try:
        run = await launch(cfg, "talk", pool)
    finally:
        await pool.close()
    import argparse

    from console.commands import follow as follow_cmd
    async with HostPool(cfg) as pool:
        rc = await follow_cmd.run(argparse.Namespace(run=run.id, node=0, lines=None, json=False),
                                  cfg, pool)
    out, err = capsys.readouterr()
    assert rc == 1      # the run failed: follow says so to a script too
    assert out.splitlines() == [f"tick {i}" for i in range(5)]
    assert f"run {run.id} failed, exit 2" in err


async def test_batches_are_lazy_and_containing_finds_metrics(tmp_path: Path) -> None:
    log = tmp_path / "v.log"
    body = "".join(f"INFO request {i}\r\n" for i in range(1000)) + VLLM + "tail\n"
    log.write_bytes(body.encode() + b"bad \xff metrics: x\n")
    f = LogFollower(LocalTransport(), str(log), start="begin", follow=False)
    batches = [b async for b in f.batches()]
    assert len(batches) == 1
    batch = batches[0]
    assert len(batch) == 1005
    hits = batch.containing(MARKERS)
    assert [h.text[:4] for h in hits] == ["INFO", "\x1b[32", "bad "]
    assert [type(parse_line(h.text)).__name__ for h in hits] == \
        ["EngineStats", "SpecDecodeStats", "NoneType"]
    everything = list(batch)                       # made on demand, identical offsets
    assert [ln for ln in everything if any(m in ln.text for m in MARKERS)] == hits
    assert everything[3] == Line(len("INFO request 0\r\n") * 3, "INFO request 3")
    assert batch[-1].text == "bad \ufffd metrics: x" and batch[-2:][0].text == "tail"


def test_logs_metrics_lines_counts_the_lines_shown(sshd: SSHD, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    spec = VLLM.splitlines()[2]
    log = tmp_path / "vllm.log"      # six metrics lines, then a long stretch of requests
    log.write_text("".join(spec.replace("2.84", f"2.{i}") + "\n" for i in range(6))
                   + "".join(f"INFO request {i}\n" for i in range(200)))
    plain = tmp_path / "plain.log"
    plain.write_text("".join(f"INFO request {i}\n" for i in range(50)))
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[hosts.gpu]\nssh = "{sshd.target}"\npython = "{sys.executable}"\n'
                   f'known_hosts = "{sshd.known_hosts}"\nidentity = "{sshd.user_key}"\n')
    assert cli_main(["--config", str(cfg), "logs", "gpu", str(log), "--metrics",
                     "--lines", "4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [ln.split("accept len ")[1].split()[0] for ln in out] == ["2.2", "2.3", "2.4", "2.5"]
    assert cli_main(["--config", str(cfg), "logs", "gpu", str(log), "--metrics", "--json",
                     "-n", "2"]) == 0
    recs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["mean_acceptance_length"] for r in recs] == [2.4, 2.5]
    assert cli_main(["--config", str(cfg), "logs", "gpu", str(plain), "--metrics",
                     "--lines", "4"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == f"-- no vLLM metrics lines in gpu:{plain}"


class _WriterBetweenReadAndStat(LocalTransport):
    """The real local transport; the file is created at the worst moment: after the follower's
    read found nothing there and before it asks whether the file exists (a run's output.log
    appears just as `follow` starts)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path, self.read_failed, self.created = path, False, False

    async def read_range(self, path: str, start: int, length: int) -> bytes:
        try:
            return await super().read_range(path, start, length)
        except CommandFailed:
            self.read_failed = True
            raise

    async def stat(self, path: str) -> Any:
        if self.read_failed and not self.created and path == str(self.path):
            self.created = True
            self.path.write_text("first\nsecond\n")
        return await super().stat(path)


async def test_a_log_created_between_the_read_and_the_stat_is_read_not_an_error(
        tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    f = LogFollower(_WriterBetweenReadAndStat(log), str(log), start="begin", poll=0.01)
    it = f.batches().__aiter__()
    got: list[str] = []
    while len(got) < 2:
        got += [ln.text for ln in await asyncio.wait_for(it.__anext__(), 5)]
    f.stop()
    assert f.transport.created and got == ["first", "second"]   # type: ignore[attr-defined]
