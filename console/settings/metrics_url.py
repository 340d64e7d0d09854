"""A host's vLLM `/metrics` URL (`metrics = "http://..."` in `[hosts.X]`), checked when the config
is read and split for the hand-made request the metrics service sends over the host's own
connection (console/logs/metrics_service.py)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_URL = "http://127.0.0.1:8000/metrics"


@dataclass(frozen=True)
class Endpoint:
    """An http:// URL split for a hand-made request over a stream the host opened."""

    url: str
    host: str
    port: int
    path: str  # with the query, as sent in the request line


def split_url(url: str) -> Endpoint:
    """The endpoint of an http:// URL; ValueError says what is wrong (https is refused: the
    request travels inside the SSH connection, and the server listens on the host's loopback)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise ValueError(f"a valid URL ({e})") from None
    if parts.scheme != "http":
        raise ValueError("an http:// URL such as " + DEFAULT_URL)
    if not parts.hostname:
        raise ValueError("an http:// URL with a host name, such as " + DEFAULT_URL)
    if parts.username or parts.password:
        raise ValueError("a URL without user:password (nothing secret goes in the config)")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if any(c in path for c in " \r\n"):
        raise ValueError("a URL without spaces or line breaks")
    return Endpoint(url=url, host=parts.hostname, port=port or 80, path=path)
