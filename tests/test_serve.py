"""Serve a drafter in vLLM: `eagle3-console serve` on the local host starts a stand-in `vllm`
executable (a script on PATH that records its argv) as a detached run; the recorded command line
carries a speculative config in vLLM's documented schema; checkpoints vLLM would not load and
verifiers that do not fit are refused before anything starts."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest

from console.checkpoints.serve import SPEC_CONFIG_FIELDS, profile_name, read_sessions
from console.cli import main as cli_main
from console.hosts.host import Host, close_hosts
from console.runs.service import list_runs, stop_run
from console.settings.config import Config, HostConfig
from tests.conftest import REPO
from tests.drafters import tiny_config, write_drafter
from tests.sshd import free_port

STANDIN = """#!/bin/sh
# stand-in vllm: record argv (a JSON list beside this script), then serve Prometheus /metrics
# on its --port (tests/vllm_metrics_standin.py) until signalled
"{python}" - "$0" "$@" <<'PY'
import json, sys
json.dump(sys.argv[2:], open(sys.argv[1] + ".argv", "w"))
PY
port=8000
while [ $# -gt 0 ]; do [ "$1" = --port ] && port=$2; shift; done
cd "{repo}" && exec "{python}" -m tests.vllm_metrics_standin "$port"
"""


@pytest.fixture
def standin_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "vllm"
    exe.write_text(STANDIN.replace("{python}", sys.executable).replace("{repo}", str(REPO)))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return exe


def local_config(tmp_path: Path) -> tuple[Config, Path]:
    root = tmp_path / "host root"
    cfg = Config(hosts={"box": HostConfig(name="box", ssh=None, python=sys.executable,
                                          root=str(root))})
    path = tmp_path / "config.toml"
    path.write_text(f'[hosts.box]\npython = "{sys.executable}"\nroot = "{root}"\n')
    return cfg, path


def write_verifier(d: Path, **changes: object) -> Path:
    c = tiny_config()
    conf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": c.hidden_size, "vocab_size": c.vocab_size, "num_hidden_layers": 6}
    conf.update(changes)
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(conf))
    return d


async def wait_file(p: Path, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while not p.is_file() or not p.read_text():
        if time.monotonic() > deadline:
            raise AssertionError(f"{p} never appeared")
        await asyncio.sleep(0.1)
    return p.read_text()


async def wait_port(port: int, timeout: float = 30) -> None:
    """Until something accepts connections on 127.0.0.1:port."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"nothing listens on 127.0.0.1:{port}") from None
            await asyncio.sleep(0.1)


async def test_serve_starts_vllm_with_a_documented_speculative_config(
        tmp_path: Path, standin_vllm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg, cfg_path = local_config(tmp_path)
    port = free_port()
    ckpt = tmp_path / "drafters" / "ft" / "out" / "final"
    write_drafter(ckpt)
    verifier = write_verifier(tmp_path / "target")
    rc = await asyncio.to_thread(cli_main, [
        "--config", str(cfg_path), "serve", "box", str(ckpt), "--verifier", str(verifier),
        "--tp", "2", "--k", "5", "--port", str(port), "--json", "--", "--max-model-len", "4096",
        "--served-model-name", "a b"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["status"] == "running"
    argv = json.loads(await wait_file(Path(str(standin_vllm) + ".argv")))
    assert argv[:2] == ["serve", str(verifier)]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--port") + 1] == str(port)
    assert argv[-4:] == ["--max-model-len", "4096", "--served-model-name", "a b"]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert set(spec) <= set(SPEC_CONFIG_FIELDS)
    assert spec == {"method": "eagle3", "model": str(ckpt), "num_speculative_tokens": 5}
    # the loop closes: the session's metrics URL, scraped through the host, reads what the
    # served "vllm" measured (acceptance length 3.4 per interval)
    session = read_sessions()[-1]
    assert session["metrics"] == f"http://127.0.0.1:{port}/metrics"
    await wait_port(port)
    capsys.readouterr()
    rc = await asyncio.to_thread(cli_main, [
        "--config", str(cfg_path), "metrics", "box", "--url", session["metrics"], "--json",
        "--count", "2", "--interval", "0.05"])
    scrapes = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rc == 0 and len(scrapes) == 2
    assert abs(scrapes[1]["interval"]["acceptance_length"] - 3.4) < 1e-9, scrapes[1]
    # registered like a profile run: listed, refused a second time, stoppable
    pool = {"box": Host(cfg.hosts["box"])}
    try:
        recs = await list_runs(pool["box"], out["id"])
        assert recs[0].profile == profile_name(str(ckpt)) == "serve-ft-final"
        rc2 = await asyncio.to_thread(cli_main, [
            "--config", str(cfg_path), "serve", "box", str(ckpt), "--verifier", str(verifier)])
        assert rc2 != 0 and "already running" in capsys.readouterr().err
        stopped = await stop_run(cfg, out["id"], pool, grace=2.0)
        assert stopped.status == "stopped"
    finally:
        await close_hosts(pool)
    assert session["run_id"] == out["id"] and session["k"] == 5


@pytest.mark.parametrize("case", ["failed-check", "vocab", "hidden", "no-config"])
async def test_serve_refuses_what_vllm_would_not_load(
        tmp_path: Path, standin_vllm: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    _, cfg_path = local_config(tmp_path)
    ckpt = tmp_path / "drafter"
    write_drafter(ckpt)
    verifier = tmp_path / "target"
    if case == "failed-check":  # a tensor of the wrong shape: inspect's `shapes` check fails
        from safetensors.torch import load_file, save_file
        sd = load_file(str(ckpt / "model.safetensors"))
        sd["fc.weight"] = sd["fc.weight"][:, :-1].contiguous()
        save_file(sd, str(ckpt / "model.safetensors"))
        write_verifier(verifier)
    elif case == "vocab":
        write_verifier(verifier, vocab_size=tiny_config().vocab_size + 1)
    elif case == "hidden":
        write_verifier(verifier, hidden_size=tiny_config().hidden_size * 2)
    else:
        verifier.mkdir()
    rc = await asyncio.to_thread(cli_main, [
        "--config", str(cfg_path), "serve", "box", str(ckpt), "--verifier", str(verifier)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1, err
    want = {"failed-check": "check shapes failed", "vocab": "vocab_size",
            "hidden": "hidden_size", "no-config": "no config.json"}[case]
    assert want in err[0]
    assert not Path(str(standin_vllm) + ".argv").exists()  # nothing was started


async def test_serve_from_the_checkpoints_pane(tmp_path: Path, standin_vllm: Path) -> None:
    """`v` on a checkpoint: the dialog, then the run started on the host; a refusal is shown."""
    from textual.widgets import Input

    from console.screens.serve_dialog import ServeDialog
    from console.widgets.inspect_view import InspectView
    from tests.test_checkpoints_pane import SIZE, app_for, checkpoints_tree, open_pane, wait_for

    shelf = checkpoints_tree(tmp_path)
    verifier = write_verifier(tmp_path / "target")
    app = app_for(tmp_path, shelf)
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_pane(pilot)
        view = pane.query_one(InspectView)
        await pilot.press("v")
        await wait_for(pilot, lambda: isinstance(app.screen, ServeDialog))
        await pilot.press("ctrl+s")  # no verifier yet: the dialog stays and says so
        await pilot.pause()
        assert isinstance(app.screen, ServeDialog)
        app.screen.query_one("#serve-verifier", Input).value = str(tmp_path / "no-such-model")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: view.error is not None)
        assert view.error.startswith("serve refused: ") and "no config.json" in view.error
        await pilot.press("v")  # the verifier typed last time is offered again
        await wait_for(pilot, lambda: isinstance(app.screen, ServeDialog))
        box = app.screen.query_one("#serve-verifier", Input)
        assert box.value == str(tmp_path / "no-such-model")
        box.value = str(verifier)
        app.screen.query_one("#serve-k", Input).value = "4"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: "started as run serve-aq-medai-eagle3" in view.plain)
    argv = json.loads(await wait_file(Path(str(standin_vllm) + ".argv")))
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["model"] == str(shelf / "aq-medai-eagle3") and spec["num_speculative_tokens"] == 4
    pool = {h: Host(c) for h, c in app.config.hosts.items()}
    try:  # stop what the pane started (the stand-in would otherwise sleep on)
        for host in pool.values():
            for rec in await list_runs(host):
                if rec.status == "running":
                    await stop_run(app.config, rec.id, pool, grace=2.0)
    finally:
        await close_hosts(pool)
