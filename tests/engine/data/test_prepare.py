"""prepare: chat-template loss masks, target features in shards, SpecForge offline files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.data.chat import tokenize_conversation
from engine.data.readers import open_data
from engine.demo.target import build_tokenizer, chats
from engine.errors import EngineError
from tests.engine_helpers import run_engine
from tests.tiny_llama import CONVS

pytest_plugins = ("tests.tiny_llama",)

LLAMA3_TEMPLATE = (
    "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")

# Drops the reasoning of earlier assistant turns: renderings are not prefixes of each other.
THINK_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}"
    "<|im_start|>assistant\n{{ m['content'].split('</think>')[-1].strip() }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def masked_runs(tok: Any, ids: list[int], mask: list[int]) -> list[str]:
    """Decode every maximal run of masked tokens (special tokens such as <|im_end|> dropped)."""
    runs, cur = [], []
    for i, m in zip(ids, mask, strict=False):
        if m:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [tok.decode(r, skip_special_tokens=True) for r in runs]


def assistant_texts(turns: list[dict[str, str]]) -> list[str]:
    return [t["content"] for t in turns if t["role"] == "assistant"]


def test_loss_mask_is_exactly_the_assistant_turns(tok: Any) -> None:
    end = tok.convert_tokens_to_ids("<|im_end|>")
    for turns in CONVS:
        t = tokenize_conversation(tok, turns)
        assert masked_runs(tok, t.input_ids, t.loss_mask) == assistant_texts(turns)
        # each assistant turn's end-of-turn marker is learned; the template's newline is not
        ends = [n for n, i in enumerate(t.input_ids) if i == end]
        assert [t.loss_mask[n] for n in ends] == [int(r["role"] == "assistant") for r in turns]
        assert all(t.loss_mask[n + 1] == 0 for n in ends if n + 1 < len(t.input_ids))


def test_loss_mask_llama3_style_template() -> None:
    tok = build_tokenizer(chats(300, 0))
    tok.add_special_tokens({"additional_special_tokens": [
        "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]})
    tok.chat_template = LLAMA3_TEMPLATE
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    for turns in CONVS:
        t = tokenize_conversation(tok, turns)
        assert masked_runs(tok, t.input_ids, t.loss_mask) == assistant_texts(turns)
        assert sum(t.loss_mask[n] for n, i in enumerate(t.input_ids) if i == eot) == \
            len(assistant_texts(turns))


def test_loss_mask_template_that_drops_earlier_reasoning() -> None:
    tok = build_tokenizer(chats(300, 0))
    tok.chat_template = THINK_TEMPLATE
    turns = [{"role": "user", "content": "count from 1 to 3"},
             {"role": "assistant", "content": "<think>easy</think> 1, 2, 3."},
             {"role": "user", "content": "spell the word sun"},
             {"role": "assistant", "content": "<think>three letters</think> s-u-n."}]
    t = tokenize_conversation(tok, turns)
    # the earlier turn as the template renders it, the last one with its reasoning
    assert masked_runs(tok, t.input_ids, t.loss_mask) == [
        "1, 2, 3.", "<think>three letters</think> s-u-n."]


def test_truncation_keeps_mask_aligned(tok: Any) -> None:
    t = tokenize_conversation(tok, CONVS[0], max_len=20)
    full = tokenize_conversation(tok, CONVS[0])
    assert t.input_ids == full.input_ids[:20] and t.loss_mask == full.loss_mask[:20]



def test_prepare_writes_shards_with_the_targets_features(tiny_target: Path, prepared: Any,
                                                         tok: Any) -> None:
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM
    out, convs, manifest = prepared
    assert manifest == json.loads((out / "manifest.json").read_text())
    assert manifest["samples"] == len(convs) and manifest["skipped"]["no_assistant_tokens"] == 1
    assert manifest["aux_layer_ids"] == [2, 3, 4] and manifest["dtype"] == "float32"
    assert manifest["target"]["hidden_size"] == 32 and manifest["max_len"] == 64
    with safe_open(str(out / manifest["shards"][0]["file"]), "pt") as f:
        assert f.get_tensor("aux_hidden_states").shape[1] == 96
        ids_meta = json.loads(f.metadata()["ids"])
    assert len(ids_meta) == len(convs)
    data = open_data(str(out))
    model = AutoModelForCausalLM.from_pretrained(tiny_target).eval()
    expected = {tuple(tokenize_conversation(tok, c, 64).input_ids): c for c in convs}
    for i in range(len(data)):
        s = data[i]
        turns = expected[tuple(s.input_ids.tolist())]  # every sample is one of ours, unpadded
        assert s.loss_mask.tolist() == tokenize_conversation(tok, turns, 64).loss_mask
        with torch.no_grad():
            hs = model(s.input_ids[None], output_hidden_states=True).hidden_states
        # aux = inputs of layers 2, N//2, N-3 = HF hidden_states[2], [3], [4]; final = post-norm
        ref = torch.cat([hs[2], hs[3], hs[4]], -1)[0]
        torch.testing.assert_close(s.aux, ref, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(s.hidden, hs[-1][0], atol=1e-4, rtol=1e-4)
    assert manifest["loss_tokens"] == sum(int(data[i].loss_mask.sum()) for i in range(len(data)))


def test_prepare_bad_line_names_file_and_field(tiny_target: Path, tmp_path: Path) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_text(json.dumps({"id": 1, "conversations": [{"role": "user", "content": "x"}]})
                   + "\n" + json.dumps({"id": 2, "turns": []}) + "\n")
    out = tmp_path / "data"
    p = run_engine("prepare", "--target", str(tiny_target), "--data", str(src), "--out", str(out),
                   check=False)
    assert p.returncode == 1
    assert p.stderr.strip() == f"error: {src}:2: field 'conversations': missing"
    assert not out.exists() and not list(tmp_path.glob("data.*"))


def test_conversation_lines_json_refuses_name_file_and_line(tmp_path: Path) -> None:
    """Bad syntax, valid syntax that json refuses (an int of 5000 digits: a ValueError that
    is not a JSONDecodeError) and Python's NaN/Infinity extension (regen would copy it on) all
    give the one-line error, never a traceback."""
    from engine.data.conversations import read_conversations
    good = json.dumps({"id": 1, "conversations": [{"role": "user", "content": "x"}]})
    for bad, why in (("{not json", "invalid JSON (Expecting property name"),
                     ('{"id": ' + "9" * 5000 + "}", "invalid JSON (Exceeds the limit"),
                     ('{"id": 2, "score": NaN, "conversations": []}', "invalid JSON (NaN is not"),
                     ('{"id": 2, "w": -Infinity}', "invalid JSON (-Infinity is not JSON)")):
        src = tmp_path / "c.jsonl"
        src.write_text(good + "\n" + bad + "\n")
        with pytest.raises(EngineError) as e:
            list(read_conversations(src))
        assert str(e.value).startswith(f"{src}:2: {why}"), str(e.value)


def specforge_dir(data_dir: str, dst: Path, n: int) -> None:
    """SpecForge's offline layout from our shards: one torch.save'd dict per sample."""
    data = open_data(data_dir)
    dst.mkdir()
    for i in range(n):
        s = data[i]
        torch.save({"input_ids": s.input_ids, "loss_mask": s.loss_mask,
                    "hidden_state": s.hidden[None], "aux_hidden_state": s.aux[None]},
                   dst / f"data_{i}.ckpt")


class _Boom:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch PWNED",))


def test_specforge_offline_files_load_and_train(tiny_target: Path, prepared: Any,
                                                tmp_path: Path) -> None:
    sf = tmp_path / "specforge"
    specforge_dir(str(prepared[0]), sf, 8)
    ours, theirs = open_data(str(prepared[0])), open_data(str(sf))
    assert len(theirs) == 8 and theirs.meta["format"] == "specforge-offline"
    for i in range(8):
        a, b = ours[i], theirs[i]
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.aux, b.aux)
        assert torch.equal(a.hidden, b.hidden) and torch.equal(a.loss_mask, b.loss_mask)
    run = tmp_path / "run"
    run_engine("train", "--target", str(tiny_target), "--data", str(sf), "--out", str(run),
               "--max-steps", "2", "--batch-tokens", "256", "--draft-vocab-size", "64",
               "--holdout", "0", "--ttt-steps", "2")
    assert json.loads((run / "run.json").read_text())["status"] == "done"
    assert (run / "final" / "model.safetensors").is_file()


def test_specforge_reader_never_unpickles(tmp_path: Path) -> None:
    sf = tmp_path / "sf"
    sf.mkdir()
    torch.save({"input_ids": _Boom()}, sf / "data_0.ckpt")  # a pickle with a code payload
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.raises(EngineError, match="data_0.ckpt: not a loadable weights-only"):
            open_data(str(sf))
    finally:
        os.chdir(cwd)
    assert not (tmp_path / "PWNED").exists()
