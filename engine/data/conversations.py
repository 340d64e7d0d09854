"""Conversations in: JSONL files of chats, in our shape or ShareGPT's.

One JSON object per line:
    {"id": "abc", "conversations": [{"role": "user", "content": "..."},
                                    {"role": "assistant", "content": "..."}]}
ShareGPT's spelling is accepted too: `{"from": "human" | "gpt" | "system", "value": "..."}` turns,
and a top-level `messages` list instead of `conversations`. Roles are normalised to
system / user / assistant (tool turns keep the role `tool`). A missing `id` becomes a stable hash of
the turns, so a rerun (regen's resume) recognises the same conversation.

Bad lines raise EngineError naming the file, the line number and the field.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from engine.errors import EngineError
from engine.fileio import atomic_file, json_line

ROLE_ALIASES = {
    "user": "user", "human": "user", "prompter": "user",
    "assistant": "assistant", "gpt": "assistant", "bot": "assistant", "model": "assistant",
    "chatgpt": "assistant", "system": "system", "tool": "tool", "function": "tool",
}


@dataclass
class Conversation:
    """One chat: an id and its turns as {"role", "content"} dicts (roles normalised)."""

    id: str
    turns: list[dict[str, str]]
    extra: dict[str, Any] = field(default_factory=dict)
    """Other top-level fields of the input line, written back unchanged by regen."""

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "conversations": self.turns, **self.extra},
                          ensure_ascii=False)

    @property
    def assistant_turns(self) -> int:
        return sum(1 for t in self.turns if t["role"] == "assistant")


def parse_line(obj: Any, where: str) -> Conversation:
    """One decoded JSON line -> Conversation; `where` ("file:line") prefixes error messages."""
    if not isinstance(obj, dict):
        raise EngineError(f"{where}: not a JSON object")
    key = "conversations" if "conversations" in obj else "messages" if "messages" in obj else None
    if key is None:
        raise EngineError(f"{where}: field 'conversations': missing")
    raw = obj[key]
    if not isinstance(raw, list) or not raw:
        raise EngineError(f"{where}: field '{key}': must be a non-empty list of turns")
    turns = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict):
            raise EngineError(f"{where}: field '{key}[{i}]': not an object")
        role = t.get("role", t.get("from"))
        content = t.get("content", t.get("value"))
        if not isinstance(role, str) or role.lower() not in ROLE_ALIASES:
            raise EngineError(f"{where}: field '{key}[{i}].role': {role!r} is not one of "
                              f"{', '.join(sorted(set(ROLE_ALIASES)))}")
        if content is None:
            content = ""  # an assistant turn to be generated may come empty
        if not isinstance(content, str):
            raise EngineError(f"{where}: field '{key}[{i}].content': must be a string")
        turns.append({"role": ROLE_ALIASES[role.lower()], "content": content})
    cid = obj.get("id")
    if cid is None:
        cid = "h" + hashlib.sha1(json.dumps(turns, sort_keys=True).encode()).hexdigest()[:16]
    elif not isinstance(cid, (str, int)):
        raise EngineError(f"{where}: field 'id': must be a string or an integer")
    extra = {k: v for k, v in obj.items() if k not in ("id", key)}
    return Conversation(id=str(cid), turns=turns, extra=extra)


def iter_conversations(path: str) -> Iterator[Conversation]:
    """Every conversation of a JSONL file, in order (blank lines skipped)."""
    if not os.path.isfile(path):
        raise EngineError(f"{path}: no such file")
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            yield parse_line(json_line(line, f"{path}:{n}"), f"{path}:{n}")


def read_conversations(path: str) -> list[Conversation]:
    """All conversations of a JSONL file; duplicate ids are an error (they break resume)."""
    out: list[Conversation] = []
    seen: set[str] = set()
    for conv in iter_conversations(path):
        if conv.id in seen:
            raise EngineError(f"{path}: field 'id': {conv.id!r} appears twice")
        seen.add(conv.id)
        out.append(conv)
    return out


def write_conversations(path: str, convs: list[Conversation]) -> None:
    """Write a JSONL file atomically (temp file, then rename)."""
    with atomic_file(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for c in convs:
            f.write(c.to_json() + "\n")
