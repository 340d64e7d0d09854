"""Fetching a vLLM server's /metrics through the host's own connection.

The request is a GET through the one HTTP client (console/transport/http_client.py): over the
host's SSH connection, bounded in time and size, gunzipped within the cap. The figures come
from console/logs/vllm_metrics.py (pure); parsing a page runs in a worker thread, off the event
loop the TUI draws from. An error quotes at most a line of what the server sent.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from console.errors import ConsoleError
from console.logs.vllm_metrics import Report, Series, Snapshot, parse_snapshot
from console.settings.metrics_url import Endpoint, split_url
from console.transport.base import Transport
from console.transport.http_client import HttpError, excerpt, fetch_ok

if TYPE_CHECKING:
    from console.hosts.host import Host

FETCH_TIMEOUT = 5.0


class MetricsError(ConsoleError):
    """The endpoint did not give a metrics page: one line naming host and URL, and why."""

    def __init__(self, host: str, url: str, why: str) -> None:
        super().__init__(f"{host}: cannot read {url}: {why}")
        self.host, self.url, self.why = host, url, why


async def fetch(transport: Transport, ep: Endpoint, timeout: float = FETCH_TIMEOUT) -> str:
    """The page at ep, fetched from the host's side. MetricsError (never another error) when
    the host, the port or the answer fails."""
    try:
        resp = await fetch_ok(transport, ep.url, accept="text/plain", timeout=timeout)
    except HttpError as e:
        raise MetricsError(transport.name, ep.url, e.why) from e
    return await asyncio.to_thread(bytes.decode, resp.body, "utf-8", "replace")


async def scrape(transport: Transport, ep: Endpoint, timeout: float = FETCH_TIMEOUT) -> Snapshot:
    """Fetch and parse one page, stamped with the time it was asked for."""
    t, clock = time.time(), time.monotonic()
    text = await fetch(transport, ep, timeout)
    try:
        return await asyncio.to_thread(parse_snapshot, text, t, clock)
    except ValueError as e:
        raise MetricsError(transport.name, ep.url, f"not a metrics page: {excerpt(str(e))}") \
            from e


async def scrape_host(host: Host, url: str, timeout: float = FETCH_TIMEOUT) -> Snapshot:
    """One page of the endpoint at `url`, fetched through the host's own connection."""
    await host.connect()
    return await scrape(host.transport, split_url(url), timeout)


class MetricsWatch:
    """One endpoint scraped again and again: each scrape's Report in its series."""

    def __init__(self, url: str) -> None:
        self.endpoint = split_url(url)
        self.series = Series()

    async def poll(self, transport: Transport, timeout: float = FETCH_TIMEOUT) -> Report:
        return self.series.add(await scrape(transport, self.endpoint, timeout))
