"""`swap` asks the running server what it serves; `compare` names each row by the weight version the
server said. A real `serve` (the stand-in `vllm` of tests/console/checkpoints/test_serve.py, as a
detached run) with a stand-in swappable vLLM answering on its port (tests/vllm_swap_standin.py:
/weight_info, /server_info, the weight-update routes, chat completions, /metrics), then the README's
flow: bench, serve-and-stop another drafter of another vocabulary, swap, bench, and the comparison
in the console (`m`)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from console.checkpoints.serve import ServeRequest, serve
from console.cli import main as cli_main
from console.hosts.host import HostPool
from console.runs.service import stop_run
from tests.drafters import tiny_config, write_drafter
from tests.panes import open_compare
from tests.runs_registry import local_app
from tests.serving import drop_fields, serve_config, stop_all, write_verifier
from tests.sshd import free_port
from tests.vllm_swap_standin import SwapServer

pytest_plugins = ("tests.serving",)

#: what a training run's --eval-server left the server on (another console's swap)
EVAL_LEFT = "step_000002@0011223344556677"


async def cli(capsys: pytest.CaptureFixture[str], *args: str, rc: int = 0) -> tuple[str, str]:
    got = await asyncio.to_thread(cli_main, list(args))
    out, err = capsys.readouterr()
    assert got == rc, (args, out, err)
    return out, err


@pytest.mark.slow
@pytest.mark.usefixtures("standin_vllm")
async def test_serve_bench_swap_bench_against_the_server_that_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    verifier = write_verifier(tmp_path / "target")
    d96, d80 = tmp_path / "shelf" / "ft96", tmp_path / "shelf" / "public80"
    step = tmp_path / "runs" / "ft" / "out" / "checkpoints" / "step_000030"
    write_drafter(d96, tiny_config(draft_vocab_size=96), seed=1)
    write_drafter(d80, tiny_config(draft_vocab_size=80), seed=2)
    write_drafter(step, tiny_config(draft_vocab_size=96), seed=3)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello"}\n{"prompt": "again"}\n')
    # the stand-in vllm stays silent: the swappable server answers on its port once serve
    # has found the port free
    drop_fields(tmp_path / "bin" / "vllm", "mute")
    port = free_port()
    cfg, cfg_path = serve_config(tmp_path)
    conf = ["--config", str(cfg_path)]
    pool = HostPool(cfg)
    srv: SwapServer | None = None
    try:
        live = await serve(cfg, "box", ServeRequest(str(d96), str(verifier), port=port), pool)
        srv = SwapServer(str(d96), str(verifier), version=EVAL_LEFT, port=port)
        srv.accept[str(step)] = 2
        await cli(capsys, *conf, "bench", "box", "--prompts", str(prompts), "--max-tokens",
                  "12", "--url", srv.url, "--json")
        # another drafter served and stopped: the newest record, of another vocabulary
        other = await serve(cfg, "box", ServeRequest(str(d80), str(verifier),
                                                     port=free_port()), pool)
        await stop_run(cfg, other.id, pool, grace=2.0)
        out, err = await cli(capsys, *conf, "swap", "box", str(step))
        assert f"{srv.url} now serves {step}" in out, out
        assert f"(was {EVAL_LEFT})" in out, out    # what the server said, not the records
        assert f"checked against {d96}, the drafter it started with (as the server says)" \
            in out, out
        assert f"note: this console's records say {live.id} serves default ({d96}); the " \
               f"server says {EVAL_LEFT}" in err, err
        assert srv.serving == str(step) and srv.version.startswith("step_000030@")
        await cli(capsys, *conf, "bench", "box", "--prompts", str(prompts), "--max-tokens",
                  "12", "--url", srv.url, "--json")

        app = local_app(cfg)
        async with app.run_test(size=(140, 36)) as pilot:
            screen = await open_compare(pilot)
            by = {(r.run_id, r.weight_version, r.started): r for r in screen.rows}
            mine = [r for r in by.values() if r.run_id == live.id]
            versions = {r.weight_version for r in mine}
            assert {EVAL_LEFT, srv.version} <= versions, versions
            swapped = [r for r in mine if r.weight_version == srv.version]
            assert all(r.drafter == str(step) and r.provenance == "ft@30" for r in swapped)
            left = next(r for r in mine if r.weight_version == EVAL_LEFT)
            assert left.drafter == EVAL_LEFT and left.note and "was not swapped in by this " \
                "console" in left.note, left
            bench_rows = [r for r in swapped if r.acceptance_length is not None]
            assert any(r.acceptance_length == pytest.approx(3.0) for r in bench_rows)
            assert any(r.run_id == other.id for r in screen.rows)
            table = screen.query_one("DataTable")
            assert table.row_count == len(screen.rows)
    finally:
        if srv is not None:
            srv.close()
        await pool.close()
        await stop_all(cfg)


@pytest.mark.slow
@pytest.mark.usefixtures("standin_vllm")
async def test_url_names_a_server_no_record_knows_and_records_fill_in_what_it_cannot_say(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--url is the server swapped, recorded or not; a server that does not say what it started
    with (no /server_info) is checked against its recorded session, and refused by name when
    nothing here records it."""
    verifier = write_verifier(tmp_path / "target")
    d96, new = tmp_path / "shelf" / "ft96", tmp_path / "shelf" / "new96"
    write_drafter(d96, tiny_config(draft_vocab_size=96), seed=1)
    write_drafter(new, tiny_config(draft_vocab_size=96), seed=3)
    stranger = SwapServer(str(d96), str(verifier))     # started by hand: no record
    mute = SwapServer(str(d96), str(verifier))
    mute.server_info = False
    cfg, cfg_path = serve_config(tmp_path)
    conf = ["--config", str(cfg_path)]
    try:
        out, _ = await cli(capsys, *conf, "swap", "box", str(new), "--url", stranger.url)
        assert f"{stranger.url} now serves {new}" in out and stranger.serving == str(new)
        _, err = await cli(capsys, *conf, "swap", "box", str(new), "--url", mute.url, rc=1)
        assert err.strip().splitlines() == [
            f"error: box: cannot tell which drafter the server at {mute.url} started with "
            f"(HTTP 404: Not Found), so {new} cannot be checked against it"], err
        assert mute.routes() == []
        # served on its port (found free: the stand-in vllm stays silent), then it answers again
        mute.close()
        drop_fields(tmp_path / "bin" / "vllm", "mute")
        pool = HostPool(cfg)
        try:
            await serve(cfg, "box", ServeRequest(str(d96), str(verifier), port=mute.port), pool)
        finally:
            await pool.close()
        mute = SwapServer(str(d96), str(verifier), port=mute.port)
        mute.server_info = False
        out, _ = await cli(capsys, *conf, "swap", "box", str(new), "--url",
                           mute.url + "/metrics", "--json")
        done: dict[str, Any] = json.loads(out)
        assert done["server"]["from"] == "records" and done["checked_against"] == str(d96)
        assert mute.serving == str(new)
    finally:
        stranger.close()
        mute.close()
        await stop_all(cfg)
