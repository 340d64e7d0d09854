"""Prompts for a `bench` replay: conversations cut before their first assistant turn, read from
a JSON-lines file on the workstation (--prompts) or the *.jsonl conversation files of a folder
on the host (--data). Each line is `{"messages": [...]}`, a ShareGPT-style `{"conversations":
[...]}`, `{"prompt": "..."}` or a JSON string; a line of another shape is one line naming the
file and line."""

from __future__ import annotations

import json
import os
import posixpath
import stat as stat_mod
from collections.abc import Iterable
from typing import Any

from console.errors import ConsoleError, TransportError
from console.hosts.host import Host
from console.transport.small_files import json_why

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
         "system": "system", "model": "assistant"}
#: prompt files are read up to here in all (a data folder may hold far more than a bench
#: replays), and one line up to LINE_LIMIT
READ_LIMIT = 256 << 20
LINE_LIMIT = 16 << 20
CHUNK = 4 << 20


def prompt_of(doc: Any, where: str) -> list[dict[str, str]]:
    """One conversation up to its first assistant turn (ConsoleError naming `where`)."""
    if isinstance(doc, str):
        return [{"role": "user", "content": doc}]
    if isinstance(doc, dict) and isinstance(doc.get("prompt"), str):
        return [{"role": "user", "content": doc["prompt"]}]
    turns = None
    if isinstance(doc, dict):
        turns = next((doc[k] for k in ("messages", "conversations", "conversation")
                      if isinstance(doc.get(k), list)), None)
    if turns is None:
        raise ConsoleError(f"{where}: expected messages, conversations, prompt or a string")
    out: list[dict[str, str]] = []
    for t in turns:
        if not isinstance(t, dict):
            raise ConsoleError(f"{where}: a turn is not an object")
        role = ROLES.get(str(t.get("role", t.get("from", ""))).lower())
        text = t.get("content", t.get("value"))
        if role is None or not isinstance(text, str):
            raise ConsoleError(f"{where}: a turn without role/from and content/value")
        if role == "assistant":
            break
        out.append({"role": role, "content": text})
    if not any(m["role"] == "user" for m in out):
        raise ConsoleError(f"{where}: no user turn before the first assistant turn")
    return out


def parse_prompts(lines: str | Iterable[str], name: str, n: int | None = None
                  ) -> list[list[dict[str, str]]]:
    """The conversations of JSON lines (a text, or its lines), the first `n` at most."""
    out: list[list[dict[str, str]]] = []
    for i, line in enumerate(lines.splitlines() if isinstance(lines, str) else lines, 1):
        if n is not None and len(out) >= n:
            break
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise ConsoleError(f"{name}:{i}: not JSON ({json_why(e)})") from None
        out.append(prompt_of(doc, f"{name}:{i}"))
    return out


def read_prompts_file(path: str, n: int | None = None) -> list[list[dict[str, str]]]:
    """The conversations of a JSON-lines file here (a regular file; read line by line, within
    READ_LIMIT, until `n` are found)."""
    try:
        if not stat_mod.S_ISREG(os.stat(path).st_mode):
            raise ConsoleError(f"--prompts {path}: not a regular file")
        with open(path, encoding="utf-8") as f:
            return parse_prompts(_bounded_lines(f, path), path, n)
    except (OSError, UnicodeDecodeError) as e:
        raise ConsoleError(f"--prompts {path}: cannot read ({e})") from None


def _bounded_lines(f: Any, name: str) -> Iterable[str]:
    total = 0
    while line := f.readline(LINE_LIMIT + 1):
        total += len(line)
        if len(line) > LINE_LIMIT:
            raise ConsoleError(f"{name}: a line longer than {LINE_LIMIT >> 20} MiB")
        if total > READ_LIMIT:
            raise ConsoleError(f"{name}: more than {READ_LIMIT >> 20} MiB read; give -n or a "
                               "smaller file")
        yield line


async def _host_lines(host: Host, path: str, budget: int) -> list[str]:
    """A regular file of the host as lines, read in chunks; ConsoleError past `budget` bytes."""
    st = await host.transport.stat(path)
    if st is None or not stat_mod.S_ISREG(st.mode):
        raise ConsoleError(f"{host.name}:{path}: not a regular file")
    if st.size > budget:
        raise ConsoleError(f"{host.name}:{path}: more than {READ_LIMIT >> 20} MiB to read; give "
                           "-n or a folder of fewer conversations")
    data = bytearray()
    while chunk := await host.transport.read_range(path, len(data), CHUNK):
        data += chunk
        if len(data) > budget:
            raise ConsoleError(f"{host.name}:{path}: more than {READ_LIMIT >> 20} MiB to read")
    text = data.decode("utf-8", errors="replace")
    return text.splitlines()


async def read_prompts_dir(host: Host, folder: str, n: int | None = None
                           ) -> list[list[dict[str, str]]]:
    """The conversations of every *.jsonl file in a folder on the host, file by file in name
    order, until `n` are found (regular files only, READ_LIMIT bytes in all)."""
    folder = await host.resolve(folder)
    res = await host.transport.run(["ls", "-1", "--", folder], check=False)
    if res.returncode != 0:
        raise ConsoleError(f"{host.name}:{folder}: cannot list ({res.stderr.strip()[:200]})")
    out: list[list[dict[str, str]]] = []
    budget = READ_LIMIT
    for name in sorted(n for n in res.stdout.splitlines() if n.endswith(".jsonl")):
        if n is not None and len(out) >= n:
            break
        path = posixpath.join(folder, name)
        try:
            lines = await _host_lines(host, path, budget)
        except TransportError as e:
            raise ConsoleError(f"{host.name}:{path}: cannot read ({e})") from None
        budget -= sum(len(x) + 1 for x in lines)
        out += parse_prompts(lines, f"{host.name}:{path}",
                             None if n is None else n - len(out))
    if not out:
        raise ConsoleError(f"{host.name}:{folder}: no conversations in *.jsonl files")
    return out
