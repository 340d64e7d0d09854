"""Swap a drafter into a running vLLM server without restarting it (the `swap` command's and the
Checkpoints pane's service).

The server is the one at `--url` on the host, else the newest recorded `serve` there whose run
still runs. It is asked what it serves (console/checkpoints/live.py: its weight version, and the
drafter, verifier and k it started with); this console's records fill in only what it cannot
say. Before any route is called the new drafter is inspected on the host and set beside the one
the server started with (vLLM built its draft model from that config), field by field: layer
kind, hidden and head sizes, target and draft vocab sizes, aux layer ids, the EAGLE 3.1 flags, k,
and every tensor's name and shape; what the running server cannot take is refused by name. Then
vLLM's own routes (mounted by `VLLM_SERVER_DEV_MODE=1`, engine/capture/swap_backend.py loads the
folder):

    POST /start_draft_weight_update
    POST /update_weights         {"update_info": {"path": CKPT}}
    POST /finish_weight_update   {"weight_version": "NAME@SHA256"}
    GET  /weight_info            -> {"weight_version": ...}   read back: the swap took

The weight version is the drafter's folder name and the sha256 of its weight files (the first
16 hex digits), so the comparison table can tell two drafters on one server apart. A route that
fails is worded by what is known (console/transport/http_client.py): a refusal leaves the old
drafter (the backend reads the whole folder before it touches the model); a lost answer to
/update_weights leaves it unknown, so the update is closed with a weight version that says so
(`unknown: NEW or OLD`) rather than with a name that may be false.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import posixpath
import time
from typing import Any

from console.checkpoints.drafter_facts import facts, stated_k, target_vocab, weight_files
from console.checkpoints.journal import SwapRecord, record
from console.checkpoints.live import (
    DEFAULT,
    Served,
    describe,
    serving_now,
    weight_info,
)
from console.checkpoints.serve import refusal, session_provenance
from console.checkpoints.service import inspect_checkpoint
from console.errors import ConsoleError
from console.hosts.host import Host
from console.transport.http_client import REFUSED, HttpError, call

#: a swap reads the whole drafter on the server: minutes for a large one
SWAP_S = 1800.0
#: closing an update after a failure (it may wait for a load still running)
CLOSE_S = 300.0
#: the weight version an update is closed with when whether it loaded is not known
UNKNOWN = "unknown: "


def refusals(new: dict[str, Any], served: dict[str, Any], k: int | None,
             new_k: int | None, target_vocab: int | None) -> list[str]:
    """Each thing the running server cannot take, by name (pure)."""
    out = []
    for name, want in served.items():
        if name == "tensors":
            continue
        if new[name] != want:
            out.append(f"{name}: the drafter has {new[name]!r}, the server runs {want!r}")
    if target_vocab is not None and new["target vocab"] not in (None, target_vocab):
        out.append(f"target vocab: the drafter has {new['target vocab']}, the verifier "
                   f"{target_vocab}")
    if k is not None and new_k is not None and new_k != k:
        out.append(f"k: the drafter's config says {new_k}, the server runs k={k}")
    if not any(o.startswith(("head_dim", "hidden_size", "draft_vocab_size")) for o in out):
        a, b = new["tensors"], served["tensors"]
        for name in sorted(set(a) | set(b)):
            if name not in a or name not in b or a[name] != b[name]:
                out.append(f"tensor {name}: the drafter has "
                           f"{list(a[name]) if name in a else 'none'}, the server runs "
                           f"{list(b[name]) if name in b else 'none'}")
                break
    return out


async def _json_file(host: Host, path: str) -> dict[str, Any]:
    res = await host.transport.run(["cat", path], check=False)
    try:
        doc = json.loads(res.stdout) if res.returncode == 0 else {}
    except ValueError:
        doc = {}
    return doc if isinstance(doc, dict) else {}


async def weight_version(host: Host, ckpt: str, report: dict[str, Any]) -> str:
    """NAME@SHA: the drafter's folder name and the sha256 of its weight files (one file: that
    file's digest; several: the digest of their sorted `name digest` lines)."""
    files = weight_files(report)
    if not files:
        raise ConsoleError(f"{host.name}:{ckpt}: no weight files to hash")
    res = await host.transport.run(["sha256sum", "--", *[posixpath.join(ckpt, f)
                                                          for f in files]], check=False)
    sums = [line.split()[0] for line in res.stdout.splitlines() if line.strip()]
    if res.returncode != 0 or len(sums) != len(files):
        raise ConsoleError(f"{host.name}:{ckpt}: cannot hash its weight files "
                           f"({res.stderr.strip()[:200]})")
    digest = sums[0] if len(sums) == 1 else hashlib.sha256(
        "".join(f"{f} {s}\n" for f, s in zip(files, sums, strict=True)).encode()).hexdigest()
    return f"{posixpath.basename(ckpt.rstrip('/'))}@{digest[:16]}"


async def plan(host: Host, served: Served, ckpt: str) -> dict[str, Any]:
    """Check the drafter against the one the server started with (vLLM built its draft model
    from that config: layer kind, sizes, aux ids and flags are fixed until it restarts);
    ConsoleError naming each refusal."""
    if served.version is None:
        raise ConsoleError(f"{host.name}: the server at {served.url} cannot swap: {served.why}; "
                           "restart it with `serve` to swap")
    if not served.started_with:
        raise ConsoleError(f"{host.name}: cannot tell which drafter the server at {served.url} "
                           f"started with ({served.why or 'no record of it here'}), so {ckpt} "
                           "cannot be checked against it")
    report = await inspect_checkpoint(host, ckpt)
    why = refusal(report)
    if why:
        raise ConsoleError(f"{host.name}:{ckpt}: vLLM would not load it: {why}")
    served_report = await inspect_checkpoint(host, served.started_with)
    raw, served_raw = await _json_file(host, posixpath.join(ckpt, "config.json")), \
        await _json_file(host, posixpath.join(served.started_with, "config.json"))
    verifier = served.verifier or ""
    target_raw = await _json_file(host, posixpath.join(verifier, "config.json")) \
        if verifier.startswith("/") else {}
    out = refusals(facts(report.to_json(), raw), facts(served_report.to_json(), served_raw),
                   served.k, stated_k(raw), target_vocab(target_raw))
    if out:
        raise ConsoleError(f"{host.name}:{ckpt}: the running server cannot take it: "
                           + "; ".join(out))
    return {"report": report, "version": await weight_version(host, ckpt, report.to_json())}


async def _now_says(host: Host, url: str) -> str:
    """What /weight_info says now, as a clause for an error line (never raises)."""
    try:
        return f"/weight_info now says {await weight_info(host, url)}"
    except HttpError as e:
        return f"it does not answer /weight_info now ({e.why}): it may have stopped, `runs " \
               f"{host.name}` shows its run"


async def _close(host: Host, url: str, version: str | None) -> str:
    """Close an open update (`version`: the label to leave; None keeps the old one); a clause
    saying how it went (never raises)."""
    try:
        await call(host.transport, url + "/finish_weight_update", "POST",
                   {} if version is None else {"weight_version": version}, timeout=CLOSE_S)
    except HttpError as e:
        return f"the update could not be closed ({e.why})"
    return "the update was closed"


async def post_routes(host: Host, url: str, ckpt: str, version: str, was: str) -> str | None:
    """vLLM's route sequence, each failure worded by what is known of it (`was`: the version
    served before). None, or a note for a swap that took though an answer was lost."""
    t = host.transport
    again = f"to know what it serves, swap a drafter in again (`eagle3-console swap " \
            f"{host.name} FOLDER`): a swap that succeeds says so for certain"
    try:
        try:
            await call(t, url + "/start_draft_weight_update", "POST", {})
        except HttpError as e:
            if e.kind != REFUSED or "already active" not in e.why:
                raise
            # an earlier swap stopped between start and finish: what it loaded is not known,
            # so the update is closed under a version that says so
            was = f"{UNKNOWN}an update left open over {was}"
            await call(t, url + "/finish_weight_update", "POST", {"weight_version": was})
            await call(t, url + "/start_draft_weight_update", "POST", {})
    except HttpError as e:
        closed = "" if e.known else f"; {await _close(host, url, None)}"
        raise ConsoleError(f"{host.name}: {ckpt} was not swapped in: opening the update failed "
                           f"({e.why}){closed}; opening loads nothing, so the server serves "
                           f"what it served ({was}) unless it stopped: "
                           f"{await _now_says(host, url)}") from e
    try:
        await call(t, url + "/update_weights", "POST", {"update_info": {"path": ckpt}},
                   timeout=SWAP_S)
    except HttpError as e:
        if e.known:   # the backend reads the whole folder before it touches the model
            closed = await _close(host, url, None)
            raise ConsoleError(f"{host.name}: the server refused {ckpt} ({e.why}); nothing was "
                               f"loaded, {closed}: it still serves {was}") from e
        label = f"{UNKNOWN}{version} or {was}"
        closed = await _close(host, url, label)
        raise ConsoleError(f"{host.name}: whether the server loaded {ckpt} is not known: POST "
                           f"/update_weights: {e.why}; {closed}"
                           + (f" with weight version {label!r}" if closed.endswith("closed")
                              else "") + f"; {again}") from e
    try:
        await call(t, url + "/finish_weight_update", "POST", {"weight_version": version},
                   timeout=SWAP_S)
    except HttpError as e:
        if e.known:
            raise ConsoleError(f"{host.name}: the server loaded {ckpt} but refused to finish "
                               f"the update ({e.why}); what it serves is not known, "
                               f"{await _now_says(host, url)}; {again}") from e
        with contextlib.suppress(HttpError):
            if await weight_info(host, url) == version:
                return f"its answer to /finish_weight_update was lost ({e.why}); /weight_info " \
                       "confirms the swap"
        closed = await _close(host, url, version)   # still open: close it as asked
        with contextlib.suppress(HttpError):
            if await weight_info(host, url) == version:
                return f"its answer to /finish_weight_update was lost ({e.why}); asked again, " \
                       f"{closed}: /weight_info confirms the swap"
        raise ConsoleError(f"{host.name}: the server loaded {ckpt} but its answer to "
                           f"/finish_weight_update was lost ({e.why}); asked again, "
                           f"{closed}; {await _now_says(host, url)}; {again}") from e
    return None


async def swap(host: Host, ckpt: str, url: str | None = None) -> dict[str, Any]:
    """Swap `ckpt` (a folder on the host) into the server at `url` (default: the newest
    recorded `serve` on the host that still runs); the result as a dict."""
    await host.connect()
    ckpt = await host.resolve(ckpt)
    session, served = await serving_now(host, url)
    base = served.url
    p = await plan(host, served, ckpt)
    was = served.version or DEFAULT
    t0 = time.monotonic()
    note = await post_routes(host, base, ckpt, p["version"], was)
    seconds = time.monotonic() - t0
    try:
        got = await weight_info(host, base)
    except HttpError as e:
        raise ConsoleError(f"{host.name}: the routes answered, but /weight_info does not "
                           f"({e.why}): whether {ckpt} serves is not confirmed") from e
    if got != p["version"]:
        raise ConsoleError(f"{host.name}: /weight_info says {got!r} after the swap, not "
                           f"{p['version']!r}")
    rec = SwapRecord(run_id=session.run_id if session else None, host=host.name, url=base,
                     drafter=ckpt, weight_version=got, previous=served.folder,
                     previous_version=was, seconds=round(seconds, 4), t=round(time.time(), 3),
                     provenance=session_provenance(p["report"]))
    record(rec)
    return {**rec.to_json(), "checked_against": served.started_with,
            "server": describe(served), "note": note}
