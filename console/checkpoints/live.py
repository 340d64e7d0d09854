"""What a running vLLM server serves, asked of the server itself (for `swap`, `compare` and
`bench`).

This workstation's journal (console/checkpoints/journal.py) says what *this* console started and
swapped; a second console, a training run's `--eval-server` or a swap that ended badly changes
the server behind its back, and a stopped session's record outlives its server. So the server
is asked first, and the journal only names what the server cannot:

    GET /weight_info                      the weight version it serves now ("default": the
                                          drafter it started with; else NAME@SHA16 of a swap)
    GET /server_info?config_format=json   (dev mode) the config it started with: the verifier
                                          (model_config.model), the drafter folder and k
                                          (speculative_config.model, num_speculative_tokens)

The folder of a swapped version is the newest swap this console recorded with that version
on the host; a version no record names stays a version without a folder (and says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from console.checkpoints.answers import StartedConfig, weight_version
from console.checkpoints.journal import Session, SwapRecord, sessions, swapped_in, swaps
from console.errors import ConsoleError
from console.hosts.host import Host
from console.runs.service import list_runs
from console.scheduler.run_status import RunStatus
from console.settings.metrics_url import split_url
from console.transport.http_client import GARBLED, REFUSED, UNREACHABLE, HttpError, call

LOOPBACK = ("127.0.0.1", "localhost", "::1")
DEFAULT = "default"
INFO_TIMEOUT = 30.0
NO_ROUTES = "it has no weight-update routes (started with `serve --no-swap`, or not by `serve`)"
#: /server_info also collects the host's environment (vLLM's collect_env) on its first call
SERVER_INFO_TIMEOUT = 120.0


def server_url(url: str) -> str:
    """A server's base URL on the host's loopback (a /metrics URL is taken for its server);
    ConsoleError naming what is wrong."""
    try:
        ep = split_url(url)
    except ValueError as e:
        raise ConsoleError(f"--url {url}: expected {e}") from None
    if ep.host not in LOOPBACK:
        raise ConsoleError(f"--url {url}: expected http://127.0.0.1:PORT, a server on the host's "
                           "loopback (its weight-update routes load folders of that host)")
    if ep.path.rstrip("/") not in ("", "/metrics"):
        raise ConsoleError(f"--url {url}: give the server's base URL, not a path")
    return f"http://{'[::1]' if ep.host == '::1' else ep.host}:{ep.port}"


def _port(url: str) -> int | None:
    try:
        return split_url(url).port
    except ValueError:
        return None


async def session_at(host: Host, base: str | None) -> Session | None:
    """The recorded session of the server at `base` on the host (None: any port), the newest
    whose run still runs, else the newest recorded; None when none is recorded."""
    port = None if base is None else _port(base)
    found = [s for s in sessions() if s.host == host.name
             and (port is None or _port(s.base_url) == port)]
    found.sort(key=lambda s: s.started or 0.0, reverse=True)
    for s in found:
        try:
            recs = await list_runs(host, s.run_id)
        except ConsoleError:
            continue
        if recs and recs[0].status == RunStatus.RUNNING:
            return s
    return found[0] if found else None


@dataclass(frozen=True)
class Served:
    """What the server at `url` serves, and where each fact came from."""

    url: str
    version: str | None         # /weight_info's (None: the server has no weight routes)
    started_with: str | None    # the drafter folder it started with
    verifier: str | None
    k: int | None
    folder: str | None          # the drafter folder serving now, when known
    provenance: str             # that drafter's RUN@STEP < SOURCE, when recorded
    asked: bool                 # the server said what it started with (else: the journal)
    why: str | None             # why the server could not say, when it could not
    disagrees: str | None       # the journal said otherwise: one line naming both

    @property
    def name(self) -> str:
        """The drafter as shown: its folder, else its version."""
        return self.folder or self.version or "?"


async def weight_info(host: Host, base: str) -> str:
    """The server's weight version (HttpError when it does not answer one)."""
    v = weight_version(await call(host.transport, base + "/weight_info", timeout=INFO_TIMEOUT))
    if not v:
        raise HttpError(host.name, f"GET {base}/weight_info", "no weight_version in its "
                        "answer", 200, GARBLED)
    return v


async def started_config(host: Host, base: str) -> StartedConfig:
    """The drafter folder, verifier and k the server started with, from /server_info."""
    return StartedConfig.parse(await call(host.transport, base + "/server_info?config_format=json",
                                          timeout=SERVER_INFO_TIMEOUT))


def recorded_version(session: Session, records: list[SwapRecord]) -> tuple[str, str]:
    """(folder, version) the journal says the session's server serves: its last recorded
    swap, else the drafter it started with."""
    done = [s for s in records if s.run_id == session.run_id]
    return (done[-1].drafter, done[-1].weight_version) if done else (session.drafter, DEFAULT)


async def ask(host: Host, base: str, session: Session | None) -> Served:
    """What the server at `base` serves (module docstring). A server without the weight
    routes (`serve --no-swap`) serves the drafter it started with: version None. HttpError
    when it does not answer /weight_info otherwise (its reason says whether it was reached)."""
    why = None
    try:
        version: str | None = await weight_info(host, base)
    except HttpError as e:
        if e.kind != REFUSED or e.status != 404:
            raise
        version, why = None, NO_ROUTES
    try:
        cfg = await started_config(host, base)
        started, verifier, k = cfg.drafter, cfg.verifier, cfg.k
    except HttpError as e:
        started, verifier, k, why = None, None, None, why or e.why
    asked = started is not None
    if not asked and session is not None:   # the server cannot say: the journal's
        started, verifier, k = session.drafter, session.verifier or None, session.k
        why = why or "no speculative model in /server_info"
    records = swaps()
    folder, prov = (started, session.provenance.cell if session is not None
                    and session.drafter == started else "") \
        if version in (DEFAULT, None) else (None, "")
    if version not in (DEFAULT, None) and \
            (rec := swapped_in(version, host.name, records)) is not None:
        folder, prov = rec.drafter, rec.provenance.cell
    disagrees = None
    if session is not None and version is not None:
        said_folder, said = recorded_version(session, records)
        if said != version:
            disagrees = f"this console's records say {session.run_id} serves {said} " \
                        f"({said_folder}); the server says {version}"
    return Served(url=base, version=version, started_with=started, verifier=verifier, k=k,
                  folder=folder, provenance=prov, asked=asked, why=why, disagrees=disagrees)


async def serving_now(host: Host, url: str | None = None) -> tuple[Session | None, Served]:
    """The server `url` names (default: the newest recorded session on the host whose run still
    runs) and what it serves, asked live: the one call `bench` and `swap` make to name the
    drafter they measure or replace. ConsoleError when no server is named or it does not say
    what it serves."""
    base = server_url(url) if url else None
    session = await session_at(host, base)
    if base is None:
        if session is None:
            raise ConsoleError(f"{host.name}: no vLLM server started by `serve` is recorded "
                               "(serve one first, or name it with --url)")
        base = session.base_url
    try:
        return session, await ask(host, base, session)
    except HttpError as e:
        raise not_answering(host, base, e) from e


def not_answering(host: Host, base: str, e: HttpError) -> ConsoleError:
    """The one line for a server that does not say what it serves."""
    if e.kind == UNREACHABLE:
        return ConsoleError(f"{host.name}: no server answers at {base} ({e.why}); `runs "
                            f"{host.name}` lists the serving runs, --url names another")
    return ConsoleError(f"{host.name}: the server at {base} does not say what it serves "
                        f"(GET /weight_info: {e.why})")


def describe(served: Served) -> dict[str, Any]:
    """For --json: what the server said and where each fact came from."""
    return {"url": served.url, "weight_version": served.version, "drafter": served.folder,
            "started_with": served.started_with, "verifier": served.verifier, "k": served.k,
            "from": "server" if served.asked else "records", "why": served.why,
            "records_disagree": served.disagrees}
