"""What an HTTP error answer says, in one place for both halves: vLLM (and OpenAI-style servers)
put their reason in a JSON `error`, `detail` or `message` field, sometimes nested as
`{"error": {"message": ...}}`; other servers (a proxy's HTML page, a plain-text 502) put it on
the body's first line. Standard library only: the console imports it too."""

from __future__ import annotations

import json


def server_message(body: bytes) -> str:
    """The server's own message in an error answer, else the first line of a body that is not
    JSON; "" when there is none (an empty body, or JSON without a message)."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        doc = json.loads(text) if text.startswith(("{", "[")) else None
    except (ValueError, RecursionError):   # a hostile body nested past Python's limit
        doc = None
    if isinstance(doc, dict):
        for key in ("error", "detail", "message"):
            v = doc.get(key)
            if isinstance(v, dict):
                v = v.get("message")
            if isinstance(v, str) and v.strip():
                return v.strip()
            if v and not isinstance(v, (dict, list)):
                return str(v)
    if text and doc is None and not text.startswith(("{", "[")):
        return text.splitlines()[0]
    return ""
