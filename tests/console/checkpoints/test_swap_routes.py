"""What `swap` says when the server fails it half-way: a stand-in swappable vLLM on 127.0.0.1
(tests/vllm_swap_standin.py) that drops the connection, answers a bad status line, stalls, cuts
its answer short or refuses, at each weight-update route. Each message says what is known of
the server's drafter (and, when it is not known, how to find out); an update left open is
closed; half an answer is never quoted."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from console.checkpoints import swap as swap_mod
from console.checkpoints.live import server_url, serving_now
from console.checkpoints.swap import post_routes, swap
from console.errors import ConsoleError
from console.hosts.host import Host, HostPool
from tests.runs_registry import local_config
from tests.serving_journal import record_session
from tests.vllm_swap_standin import SwapServer

OLD, NEW, CKPT = "old@00", "new@11", "/drafters/new"
ROUTES = ["/start_draft_weight_update", "/update_weights", "/finish_weight_update"]


@pytest.fixture
def server() -> Iterator[SwapServer]:
    srv = SwapServer("/drafters/old", "/target", version=OLD, need_weights=False)
    yield srv
    srv.close()


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[Host]:
    pool = HostPool(local_config(tmp_path / "host"))
    try:
        yield await pool.ensure("local")
    finally:
        await pool.close()


async def failed(host: Host, srv: SwapServer) -> str:
    with pytest.raises(ConsoleError) as e:
        await post_routes(host, srv.url, CKPT, NEW, OLD)
    msg = str(e.value)
    assert "\n" not in msg and "HTTP None" not in msg, msg
    return msg


@pytest.mark.parametrize("fault", ["drop", "badline", "stall"])
async def test_a_lost_answer_to_update_weights_is_not_a_refusal(
        host: Host, server: SwapServer, fault: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server loaded the drafter and its answer was lost (connection dropped, a status
    line that is not HTTP, no answer in time): not known what it serves, said so; the update
    is closed under a version that says so, never under the old drafter's name."""
    monkeypatch.setattr(swap_mod, "SWAP_S", 1.0)
    server.faults["/update_weights"] = fault
    msg = await failed(host, server)
    assert f"whether the server loaded {CKPT} is not known" in msg, msg
    assert "refused" not in msg and "still serves" not in msg, msg
    assert f"swap a drafter in again (`eagle3-console swap {host.name} FOLDER`)" in msg, msg
    assert "the update was closed with weight version 'unknown: new@11 or old@00'" in msg, msg
    assert server.routes() == ROUTES
    assert not server.open and server.version == f"unknown: {NEW} or {OLD}"


async def test_a_refused_update_closes_it_and_keeps_the_old_drafter(
        host: Host, server: SwapServer) -> None:
    server.faults["/update_weights"] = "refuse"
    msg = await failed(host, server)
    assert msg == (f"local: the server refused {CKPT} (HTTP 400: refused /update_weights "
                   f"[/b]); nothing was loaded, the update was closed: it still serves {OLD}")
    assert server.routes() == ROUTES and not server.open and server.version == OLD


async def test_a_lost_answer_when_opening_closes_what_it_may_have_opened(
        host: Host, server: SwapServer) -> None:
    server.faults["/start_draft_weight_update"] = "drop"
    msg = await failed(host, server)
    assert "was not swapped in: opening the update failed (the connection closed with no " \
           "answer); the update was closed" in msg, msg
    assert f"/weight_info now says {OLD}" in msg, msg
    assert server.routes() == ROUTES[:1] + ROUTES[2:] and not server.open


async def test_a_cut_answer_to_finish_is_checked_not_quoted(
        host: Host, server: SwapServer) -> None:
    """The finish took and its answer was cut (its half body holds markup and an escape): the
    swap is confirmed by /weight_info; nothing of the cut body is shown."""
    server.faults["/finish_weight_update"] = "cut"
    note = await post_routes(host, server.url, CKPT, NEW, OLD)
    assert note is not None and "/weight_info confirms the swap" in note, note
    assert "[/b]" not in note and "\x1b" not in note and "weight_version" not in note, note
    assert "cut short" in note, note
    assert server.version == NEW and not server.open


async def test_a_lost_finish_is_asked_again(host: Host, server: SwapServer) -> None:
    """The finish never reached the update (connection closed first): asked again, it closes
    with the new version, and that is confirmed."""
    server.faults["/finish_weight_update"] = "early"
    note = await post_routes(host, server.url, CKPT, NEW, OLD)
    assert note is not None and "asked again, the update was closed: /weight_info confirms" \
        in note, note
    assert server.routes() == [*ROUTES, ROUTES[2]] and server.version == NEW


async def test_a_refused_finish_says_the_drafter_is_not_known(
        host: Host, server: SwapServer) -> None:
    server.faults["/finish_weight_update"] = "refuse"
    msg = await failed(host, server)
    assert f"the server loaded {CKPT} but refused to finish the update (HTTP 400" in msg, msg
    assert "what it serves is not known" in msg and "swap a drafter in again" in msg, msg


async def test_an_update_left_open_is_closed_as_unknown(host: Host, server: SwapServer) -> None:
    """An earlier swap killed between its routes left an update open: what it loaded is not
    known, so it is closed under a version that says so before this swap starts its own."""
    server.open = True
    server.faults["/update_weights"] = "refuse"
    msg = await failed(host, server)
    assert msg.endswith("it still serves unknown: an update left open over old@00"), msg
    assert server.routes() == [ROUTES[0], ROUTES[2], *ROUTES]
    assert server.version == "unknown: an update left open over old@00"


async def test_a_server_without_weight_routes_serves_its_recorded_drafter(
        host: Host, server: SwapServer) -> None:
    """`serve --no-swap` (no dev mode): what it serves is the drafter it started with, as
    recorded (what `bench` names); `swap` refuses it by name before anything is inspected."""
    server.dev = False
    record_session({"run_id": "serve-plain-1", "host": "local", "drafter": "/drafters/old",
                    "port": server.port, "started": 1.0, "swappable": False})
    session, served = await serving_now(host)
    assert session is not None and session.run_id == "serve-plain-1"
    assert (served.version, served.name, served.asked) == (None, "/drafters/old", False)
    with pytest.raises(ConsoleError, match=r"^local: the server at http://127.0.0.1:\d+ cannot "
                                           r"swap: it has no weight-update routes"):
        await swap(host, CKPT)
    assert server.routes() == []


def test_url_is_a_server_on_the_hosts_loopback() -> None:
    """The weight routes load folders of the host: a server elsewhere is never swapped."""
    assert server_url("http://localhost:8001/metrics") == "http://localhost:8001"
    assert server_url("http://127.0.0.1:8001/") == "http://127.0.0.1:8001"
    for url, why in (("http://gpu-box.example:8000", "a server on the host's loopback"),
                     ("http://127.0.0.1:8000/v1", "not a path"),
                     ("https://127.0.0.1:8000", "expected an http:// URL")):
        with pytest.raises(ConsoleError, match=f"^--url {url}: .*{why}"):
            server_url(url)
