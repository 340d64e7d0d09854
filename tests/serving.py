"""Serving on this machine in tests: the stand-in `vllm` on PATH (the `standin_vllm` fixture: use
with `pytest_plugins = ("tests.serving",)`), a host `box` and its config file, a verifier's
config, `serve` through the CLI and every running run stopped afterwards."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from console.cli import main as cli_main
from console.hosts.host import HostPool
from console.runs.service import list_runs, stop_run
from console.settings.config import Config, HostConfig
from tests.drafters import tiny_config
from tests.paths import REPO
from tests.vllm_serve_standin import STANDIN


@pytest.fixture
def standin_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "vllm"
    exe.write_text(STANDIN.replace("{python}", sys.executable).replace("{repo}", str(REPO)))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return exe


def drop_fields(standin: Path, *words: str) -> None:
    """Tell the stand-in to leave these fields out of its startup log."""
    Path(str(standin) + ".drop").write_text(" ".join(words))


def serve_config(tmp_path: Path) -> tuple[Config, Path]:
    """Host `box` on this machine: the config and the file that holds it."""
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


async def serve_cli(cfg_path: Path, ckpt: Path, verifier: Path, port: int, *extra: str) -> int:
    return await asyncio.to_thread(cli_main, [
        "--config", str(cfg_path), "serve", "box", str(ckpt), "--verifier", str(verifier),
        "--port", str(port), *extra])


async def stop_all(cfg: Config) -> None:
    """Stop every run still running on host `box`."""
    pool = HostPool(cfg)
    try:
        for rec in await list_runs(pool["box"]):
            if rec.status == "running":
                await stop_run(cfg, rec.id, pool, grace=2.0)
    finally:
        await pool.close()
