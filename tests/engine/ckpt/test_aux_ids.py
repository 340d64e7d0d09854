"""Aux layer ids vLLM can serve: distinct ids chosen, repeats refused by inspect (and so by serve),
ids that differ from what serving engines compute written into the config; and the capture
self-check that rebuilds the target's log-probs from a captured final state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.capture.vllm_engine import self_check
from engine.ckpt.config_styles import to_eagle_dict
from engine.errors import EngineError
from engine.model.config import aux_ids_problem, default_aux_layer_ids, serving_default_aux_ids
from tests.drafters import tiny_config, write_drafter
from tests.engine_helpers import run_engine

pytest_plugins = ("tests.demo_workspace",)


@pytest.mark.parametrize("n", range(3, 70))
def test_default_ids_are_distinct_in_range_and_the_spec_defaults_where_those_are(n: int) -> None:
    ids = default_aux_layer_ids(n)
    assert len(set(ids)) == 3 and ids == sorted(ids) and 0 <= ids[0] and ids[-1] <= n - 1
    if aux_ids_problem(serving_default_aux_ids(n)) is None:
        assert ids == serving_default_aux_ids(n)
    else:
        assert n < 7


def test_six_layers_get_the_nearest_distinct_layers_and_fewer_than_three_are_refused() -> None:
    assert serving_default_aux_ids(6) == [2, 3, 3] and default_aux_layer_ids(6) == [2, 3, 4]
    with pytest.raises(EngineError, match="2 decoder layer"):
        default_aux_layer_ids(2)


def test_ids_other_than_the_serving_defaults_are_written_and_the_defaults_are_not() -> None:
    six = to_eagle_dict(tiny_config(target_num_layers=6, aux_layer_ids=[2, 3, 4]))
    assert six["eagle_aux_hidden_state_layer_ids"] == [2, 3, 4]   # vLLM would compute 2, 3, 3
    seven = to_eagle_dict(tiny_config(target_num_layers=7, aux_layer_ids=[2, 3, 4]))
    assert "eagle_aux_hidden_state_layer_ids" not in seven         # what vLLM computes anyway


def _inspect(d: Path) -> tuple[int, dict[str, Any]]:
    p = run_engine("inspect", str(d), "--json", check=False)
    return p.returncode, json.loads(p.stdout)


def test_inspect_fails_a_drafter_whose_ids_repeat(tmp_path: Path) -> None:
    write_drafter(tmp_path / "rep", tiny_config(target_num_layers=6, aux_layer_ids=[2, 3, 3]))
    rc, report = _inspect(tmp_path / "rep")
    check = next(c for c in report["checks"] if c["name"] == "aux_layer_ids")
    assert rc == 1 and not report["ok"] and not check["ok"]
    assert "[2, 3, 3] (eagle_aux_hidden_state_layer_ids) repeat [3]" in check["detail"]
    assert "de-duplicates" in check["detail"]
    # no ids in the config and 6 target layers: what vLLM computes repeats too
    write_drafter(tmp_path / "dflt", tiny_config(target_num_layers=6))
    rc, report = _inspect(tmp_path / "dflt")
    check = next(c for c in report["checks"] if c["name"] == "aux_layer_ids")
    assert rc == 1 and "the defaults for 6 target layers" in check["detail"]
    write_drafter(tmp_path / "ok", tiny_config(target_num_layers=6, aux_layer_ids=[2, 3, 4]))
    rc, report = _inspect(tmp_path / "ok")
    assert rc == 0 and next(c for c in report["checks"] if c["name"] == "aux_layer_ids")["ok"]


@pytest.mark.slow
def test_the_demo_drafters_ids_are_distinct(demo_dir: Path) -> None:
    rc, report = _inspect(demo_dir / "public-drafter")
    assert rc == 0, report
    assert report["config"]["aux_layer_ids"] == [2, 3, 4]
    conf = json.loads((demo_dir / "public-drafter" / "config.json").read_text())
    assert "eagle_aux_hidden_state_layer_ids" not in conf  # 7 layers: what vLLM computes


# -- the capture self-check -----------------------------------------------------------------

@pytest.fixture(scope="module")
def demo_forward(demo_dir: Path) -> dict[str, Any]:
    """The demo target's hidden states and its own next-token log-probs for one sample."""
    from transformers import AutoModelForCausalLM

    from engine.data.readers import open_data
    model = AutoModelForCausalLM.from_pretrained(str(demo_dir / "target"), dtype=torch.float32)
    ids = open_data(str(demo_dir / "eval"))[0].input_ids
    with torch.no_grad():
        out = model(ids[None], output_hidden_states=True)
    logp = torch.log_softmax(out.logits[0].float(), -1)
    prompt_lp: list[float | None] = [None] + [float(logp[t, ids[t + 1]])
                                              for t in range(len(ids) - 1)]
    return {"ids": ids.tolist(), "states": out.hidden_states, "prompt_lp": prompt_lp,
            "head": model.lm_head.weight.detach().float()}


def test_the_self_check_passes_the_final_state_and_stops_at_the_layer_before(
        demo_forward: dict[str, Any]) -> None:
    f = demo_forward
    final = f["states"][-1][0]                 # after the final norm: what a shard stores
    res = self_check("s0", f["ids"], final, f["prompt_lp"], f["head"], tol=0.02)
    assert res["positions"] > 10 and res["mean"] < 1e-4
    # the bug class of vLLM PR 46973: the state of layer N-1 handed back as layer N's
    wrong = f["states"][-2][0]
    with pytest.raises(EngineError, match="self-check failed on sample 's0'"):
        self_check("s0", f["ids"], wrong, f["prompt_lp"], f["head"], tol=0.02)
