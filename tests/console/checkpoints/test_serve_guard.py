"""What `serve` refuses before it starts anything: a port something already holds (a serving
run, named with the command that frees it, or another process), a second copy of a drafter
(with the command `serve` takes, not `launch`'s), any spelling of a host option that would take
a swappable server off the loopback (checked against what vLLM's own parser makes of the
line), and a verifier whose config.json is not a regular file."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from console.checkpoints.serve import ServeRequest, vllm_argv
from console.cli import main as cli_main
from console.errors import ConsoleError
from tests.drafters import write_drafter
from tests.serving import serve_cli, serve_config, stop_all, write_verifier
from tests.sshd import free_port
from tests.waiting import wait_port

pytest_plugins = ("tests.vllm_real", "tests.serving")

HOSTILE_EXTRAS = [
    ["--host", "0.0.0.0"], ["--host=0.0.0.0"], ["--ho", "0.0.0.0"], ["--hos=0.0.0.0"],
    ["--max-model-len", "512", "--host=::"], ["--", "--host", "0.0.0.0"],
]


@pytest.mark.parametrize("extra", HOSTILE_EXTRAS, ids=" ".join)
def test_every_spelling_of_a_host_option_is_refused(extra: list[str]) -> None:
    req = ServeRequest(ckpt="/d", verifier="/t", extra=extra)
    with pytest.raises(ConsoleError, match="loopback|positional"):
        req.check()
    ServeRequest(ckpt="/d", verifier="/t", extra=extra, swappable=False).check()  # --no-swap


#: run with vLLM's Python: each command line (after `vllm`) through the parser `vllm serve`
#: builds, printing the host it would listen on (or the parser's refusal)
PROBE = """
import contextlib, io, json, sys
import vllm.entrypoints.cli.serve as serve
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser(description="vLLM CLI")
sub = parser.add_subparsers(required=False, dest="subparser")
for cmd in serve.cmd_init():
    cmd.subparser_init(sub)
out = []
for argv in json.loads(sys.stdin.read()):
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            out.append(parser.parse_args(argv).host)
    except (SystemExit, Exception):
        out.append("refused")
print("PROBE " + json.dumps(out))
"""


@pytest.mark.vllm
def test_vllms_parser_keeps_a_swappable_server_on_the_loopback(vllm_python: str,
                                                               tmp_path: Path) -> None:
    """Each line the console would start, as vLLM 0.32's parser reads it: on 127.0.0.1 or not
    started at all, whatever the passed-through words and a --config file say."""
    from tests.vllm_real import vllm_env
    cfg = tmp_path / "c.yaml"
    cfg.write_text("host: 0.0.0.0\nport: 9001\n")
    extras = [*HOSTILE_EXTRAS, ["--config", str(cfg)], ["--config", str(cfg), "--port=9002"],
              ["--served-model-name", "a", "b"], ["--config=" + str(cfg)], []]
    lines = []
    for extra in extras:
        req = ServeRequest(ckpt="/d", verifier="/t", extra=extra)
        try:
            req.check()
        except ConsoleError:
            continue
        lines.append(vllm_argv(req, ()))
    assert len(lines) == 5   # the four the console lets through, and none
    p = subprocess.run([vllm_python, "-c", PROBE], input=json.dumps(lines), text=True,
                       capture_output=True, env=vllm_env(), timeout=300)
    hosts = json.loads(next(ln for ln in p.stdout.splitlines()
                            if ln.startswith("PROBE "))[6:])
    assert all(h == "127.0.0.1" for h in hosts), list(zip(lines, hosts, strict=True))


@pytest.mark.usefixtures("standin_vllm")
async def test_a_port_another_process_holds_is_refused_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, cfg_path = serve_config(tmp_path)
    ckpt = tmp_path / "drafter"
    write_drafter(ckpt)
    verifier = write_verifier(tmp_path / "target")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rc = await serve_cli(cfg_path, ckpt, verifier, port)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert f"port {port} is taken by pid {os.getpid()}" in err[0], err
    assert "serve on another --port" in err[0]
    assert not (tmp_path / "bin" / "vllm.argv").exists()   # nothing was started


@pytest.mark.slow
@pytest.mark.usefixtures("standin_vllm")
async def test_a_port_a_serving_run_holds_is_refused_naming_the_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Another drafter on the port of a running server: refused, naming the run and what it
    serves (while it starts, and once it listens); the same drafter again on another port:
    refused with `serve`'s own options."""
    cfg, cfg_path = serve_config(tmp_path)
    first, second = tmp_path / "first", tmp_path / "second"
    write_drafter(first)
    write_drafter(second, seed=1)
    verifier = write_verifier(tmp_path / "target")
    port = free_port()
    try:
        assert await serve_cli(cfg_path, first, verifier, port, "--no-check", "--json") == 0
        run_id = json.loads(capsys.readouterr().out)["id"]
        for _ in range(2):   # at once (still starting, perhaps), then listening
            rc = await serve_cli(cfg_path, second, verifier, port, "--no-check")
            err = capsys.readouterr().err.strip().splitlines()
            assert rc == 1 and len(err) == 1, err
            assert f"port {port} is " in err[0] and f"run {run_id} (serving {first})" in err[0]
            assert f"`eagle3-console stop {run_id}`" in err[0]
            await wait_port(port)
        rc = await serve_cli(cfg_path, first, verifier, free_port(), "--no-check")
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 1 and f"already served by run {run_id} (port {port})" in err[0], err
        assert "--force" in err[0] and "launch" not in err[0]
    finally:
        await stop_all(cfg)


@pytest.mark.parametrize("case", ["dev-zero", "fifo", "folder"])
@pytest.mark.usefixtures("standin_vllm")
async def test_a_verifier_config_that_is_not_a_regular_file_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    """A config.json that is /dev/zero (endless), a FIFO (blocks) or a folder: one line, at
    once, nothing started."""
    _, cfg_path = serve_config(tmp_path)
    ckpt = tmp_path / "drafter"
    write_drafter(ckpt)
    verifier = tmp_path / "target"
    verifier.mkdir()
    conf = verifier / "config.json"
    if case == "dev-zero":
        conf.symlink_to("/dev/zero")
    elif case == "fifo":
        os.mkfifo(conf)
    else:
        conf.mkdir()
    rc = await asyncio.wait_for(asyncio.to_thread(cli_main, [
        "--config", str(cfg_path), "serve", "box", str(ckpt), "--verifier", str(verifier),
        "--port", str(free_port())]), 120)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert f"{conf}: not a regular file" in err[0], err
    assert not (tmp_path / "bin" / "vllm.argv").exists()


def test_the_guard_runs_with_the_hosts_python() -> None:
    """The port check is a standard-library script (a host's Python may be 3.8)."""
    from console.checkpoints.serve_guard import _PORT_SCRIPT
    p = subprocess.run([sys.executable, "-c", _PORT_SCRIPT, str(free_port())],
                       capture_output=True, text=True, timeout=60)
    assert json.loads(p.stdout) == {"free": True, "why": "", "holders": []}
