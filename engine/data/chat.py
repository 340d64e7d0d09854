"""Chat template -> token ids and the loss mask (1 on assistant tokens only).

Wrong masks on chat templates are a classic failure of drafter trainers, so the mask is derived
from the template's own rendering rather than from a per-model regex:

1. Prefix rendering (exact): for assistant turn k, the rendered text of turns[:k] with the
   generation prompt is a prefix of the full rendering, and turns[:k+1] rendered ends where the
   turn ends. The characters in between are the assistant's turn: its content and the template's
   end-of-turn marker (e.g. `<|im_end|>`, `<|eot_id|>`), which the drafter must learn to predict
   too. Trailing whitespace after the marker belongs to the template and is left out.
2. Search (fallback, for templates whose renderings are not prefixes of each other, e.g. ones that
   drop earlier turns' reasoning): the content is searched in order after the previous turns'
   contents and after the assistant header, then extended over the end-of-turn marker learned by
   rendering a probe conversation.

Tokens are masked when their character span overlaps an assistant span (fast tokenizer offsets).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import EngineError

_PROBE = "\x00PROBE\x00"


@dataclass
class Tokenized:
    """One conversation as tokens: ids and a 0/1 loss mask of the same length."""

    input_ids: list[int]
    loss_mask: list[int]


def render(tok: Any, turns: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
    """The chat template's text for these turns."""
    return str(tok.apply_chat_template(turns, tokenize=False,
                                       add_generation_prompt=add_generation_prompt))


def _end_marker(tok: Any) -> str:
    """The text a template puts after an assistant's content, without trailing whitespace."""
    text = render(tok, [{"role": "user", "content": "hi"},
                        {"role": "assistant", "content": _PROBE}])
    at = text.find(_PROBE)
    return "" if at < 0 else text[at + len(_PROBE):].rstrip()


def assistant_spans(tok: Any, turns: list[dict[str, str]], text: str) -> list[tuple[int, int]]:
    """Character spans [start, end) of every assistant turn inside `text` (the full rendering)."""
    spans: list[tuple[int, int]] = []
    prefix_ok = True
    for k, t in enumerate(turns):
        if t["role"] != "assistant":
            continue
        before = render(tok, turns[:k], add_generation_prompt=True) if k else ""
        upto = render(tok, turns[: k + 1])
        if not (text.startswith(upto) and upto.startswith(before)):
            prefix_ok = False
            break
        start = len(before)
        spans.append((start, start + len(upto[start:].rstrip())))
    if prefix_ok:
        return spans
    return _search_spans(tok, turns, text)


def _search_spans(tok: Any, turns: list[dict[str, str]], text: str) -> list[tuple[int, int]]:
    marker = _end_marker(tok)
    header = render(tok, [{"role": "user", "content": "hi"}], add_generation_prompt=True)
    header = header[len(render(tok, [{"role": "user", "content": "hi"}])):].strip()
    spans: list[tuple[int, int]] = []
    cursor = 0
    for t in turns:
        content = t["content"].strip()
        if t["role"] == "assistant" and header:
            at = text.find(header, cursor)
            cursor = at + len(header) if at >= 0 else cursor
        at = text.find(content, cursor) if content else cursor
        if at < 0 and "</think>" in content:  # templates that drop earlier reasoning
            content = content.split("</think>", 1)[1].strip()
            at = text.find(content, cursor)
        if at < 0:
            raise EngineError(f"{t['role']} turn text not found in the chat template's rendering")
        end = at + len(content)
        if t["role"] == "assistant":
            if marker and text.startswith(marker, end):
                end += len(marker)
            spans.append((at, end))
        cursor = end
    return spans


def tokenize_conversation(tok: Any, turns: list[dict[str, str]], max_len: int | None = None
                          ) -> Tokenized:
    """Render with the chat template, tokenize, and mask assistant tokens (module docstring)."""
    if not getattr(tok, "is_fast", False):
        raise EngineError("the target's tokenizer is not a fast tokenizer (tokenizer.json "
                          "missing): offsets are needed to build the loss mask")
    if getattr(tok, "chat_template", None) is None:
        raise EngineError("the target's tokenizer has no chat template "
                          "(tokenizer_config.json 'chat_template' or chat_template.jinja)")
    text = render(tok, turns)
    spans = assistant_spans(tok, turns, text)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids: list[int] = list(enc["input_ids"])
    mask = [0] * len(ids)
    si = 0
    for n, (a, b) in enumerate(enc["offset_mapping"]):
        while si < len(spans) and spans[si][1] <= a:
            si += 1
        if si < len(spans) and a < spans[si][1] and b > spans[si][0]:
            mask[n] = 1
    if max_len is not None:
        ids, mask = ids[:max_len], mask[:max_len]
    return Tokenized(input_ids=ids, loss_mask=mask)


def prompt_ids(tok: Any, turns: list[dict[str, str]]) -> list[int]:
    """Token ids of the turns rendered with the generation prompt (what a server would feed)."""
    text = render(tok, turns, add_generation_prompt=True)
    return list(tok(text, add_special_tokens=False)["input_ids"])
