"""Served acceptance during training (`train --eval-server URL`): each checkpoint is swapped into
a running vLLM on this host, the held-out prompts are replayed there, and the acceptance vLLM
counts is emitted as a `served acceptance` metric event (engine/events.py SERVED).

The server is one `serve` started (or any vLLM started the same way): weight-update routes
mounted (`VLLM_SERVER_DEV_MODE=1`) and our drafter backend (engine/capture/swap_backend.py),
bound to the loopback. The routes load files the server can read, so the URL must be this
host's loopback: the exported checkpoint is a folder in the run directory. One measurement:

    RUN/served/step_NNNNNN/         the checkpoint exported in the vLLM style
    POST /start_draft_weight_update
    POST /update_weights            {"update_info": {"path": FOLDER}}
    POST /finish_weight_update      {"weight_version": "step_NNNNNN@SHA16"}
    GET  /metrics                   counters before
    POST /v1/completions  x N       each held-out prompt's token ids, greedy, up to max_tokens
                                    M or the reply's end, a few at once
    GET  /metrics                   counters after (once they have grown by the replay's tokens)

Greedy speculative decoding returns the target's own tokens whatever the drafter, so every
checkpoint is measured on the same replies (`generated_tokens` is the same at every step). The
replies stop at their end (EOS), as served traffic does: past it (vLLM's `ignore_eos`) the
target writes text no conversation holds, which no drafter was trained on (on the demo, 150
steps measured 3.107 to EOS and 1.475 with ignore_eos on the same prompts).

The figures are the deltas: acceptance length 1 + accepted / drafts, per-position
acceptance accepted_i / drafts. The weight version is the folder's name and the first 16 hex
digits of its weights' sha256, as the console's `swap` writes it (console/checkpoints/swap.py).

The drafter the server ran before (read at start: `/weight_info`, and for version "default" the
speculative model of `/server_info`; any other version needs its folder, `--eval-server-drafter`,
whose version must match) is swapped back at the end of the run, on a stop (SIGTERM) and on a
failure, with its own weight version: the server is left as it was found. Standard library HTTP
only (engine/bounded_http.py: every request has a deadline and a size cap).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.bounded_http import connection, send
from engine.errors import EngineError
from engine.fileio import sha256_file

LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: requests in flight during a replay (the figures are counted by vLLM, whatever the batching)
CONCURRENCY = 8
#: how long vLLM's counters may lag the last answer (it records stats after sending outputs)
SETTLE_S = 10.0
#: a swap reads the whole drafter on the server: minutes for a large one
SWAP_DEADLINE_S = 1800.0
REQUEST_DEADLINE_S = 600.0
COUNTER = re.compile(r'^(vllm:[a-z_]+?)(?:_total)?(?:\{([^}]*)\})?\s+([0-9.eE+-]+|NaN)\s*$')


def check_url(url: str) -> str:
    """The server's base URL (no trailing slash); EngineError unless http:// on the loopback."""
    u = urllib.parse.urlsplit(url)
    try:
        port = u.port
    except ValueError:
        port = None
    if u.scheme != "http" or u.hostname not in LOOPBACK or port is None:
        raise EngineError(f"--eval-server {url}: expected http://127.0.0.1:PORT, a vLLM on this "
                          "host's loopback (its weight-update routes load folders of this "
                          "host; they are never opened to the network)")
    if u.path.rstrip("/") not in ("", "/metrics"):
        raise EngineError(f"--eval-server {url}: give the server's base URL "
                          f"(http://{u.netloc}), not a path")
    return f"http://{u.netloc}"


def weight_version(folder: str | Path) -> str:
    """NAME@SHA16 for a drafter folder: the sha256 of its one weight file, or of the sorted
    `name digest` lines of several (console/checkpoints/swap.py's rule)."""
    folder = Path(folder)
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise EngineError(f"{folder}: no *.safetensors weight files")
    sums = [sha256_file(folder / f) for f in files]
    digest = sums[0] if len(sums) == 1 else hashlib.sha256(
        "".join(f"{f} {s}\n" for f, s in zip(files, sums, strict=True)).encode()).hexdigest()
    return f"{folder.resolve().name}@{digest[:16]}"


@dataclass
class Counters:
    """vLLM's speculative-decoding counters in one /metrics page (summed over engines)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    generation_tokens: float = 0.0
    per_position: dict[int, float] = field(default_factory=dict)


NAMES = {"vllm:spec_decode_num_drafts": "drafts",
         "vllm:spec_decode_num_draft_tokens": "draft_tokens",
         "vllm:spec_decode_num_accepted_tokens": "accepted",
         "vllm:generation_tokens": "generation_tokens"}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def parse_counters(text: str) -> Counters:
    """The counters of a Prometheus text page (other lines ignored; pure)."""
    c = Counters()
    for line in text.splitlines():
        m = COUNTER.match(line)
        if m is None or m[1].endswith("_created"):
            continue
        try:
            value = float(m[3])
        except ValueError:
            continue
        if m[1] in NAMES:
            setattr(c, NAMES[m[1]], getattr(c, NAMES[m[1]]) + value)
        elif m[1] == PER_POSITION:
            pos = re.search(r'position="(\d+)"', m[2] or "")
            if pos:
                i = int(pos[1])
                c.per_position[i] = c.per_position.get(i, 0.0) + value
    return c


def figures(before: Counters, after: Counters) -> dict[str, float | int | None]:
    """The acceptance of what happened between two pages (pure): acceptance_length, pos_i."""
    drafts = after.drafts - before.drafts
    accepted = after.accepted - before.accepted
    out: dict[str, float | int | None] = {
        "acceptance_length": 1 + accepted / drafts if drafts > 0 else None,
        "drafts": int(drafts), "draft_tokens": int(after.draft_tokens - before.draft_tokens),
        "accepted": int(accepted)}
    for i in sorted(after.per_position):
        got = after.per_position[i] - before.per_position.get(i, 0.0)
        out[f"pos_{i}"] = got / drafts if drafts > 0 else None
    return out


class ServedEval:
    """One serving endpoint measured at each checkpoint (module docstring)."""

    def __init__(self, url: str, prompts: list[list[int]], max_tokens: int,
                 restore_folder: str | None = None) -> None:
        self.url = check_url(url)
        self.prompts, self.max_tokens = prompts, max_tokens
        self.restore_folder = restore_folder
        self.original: tuple[str, str] | None = None   # (folder, weight version) to swap back
        self.swapped = False                            # a checkpoint is in the server now
        self.model = ""

    # -- HTTP ----------------------------------------------------------------------------------
    def call(self, method: str, path: str, body: Any = None,
             deadline: float = REQUEST_DEADLINE_S, as_json: bool = True) -> Any:
        """One request's answer (JSON, or text); EngineError naming the URL and vLLM's reason."""
        data = None if body is None else json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn = connection(self.url, deadline)
        what = f"{method} {self.url}{path}"
        try:
            ans = send(conn, method, path, data, headers, deadline)
        except (OSError, TimeoutError) as e:
            raise EngineError(f"--eval-server: {what}: {e}") from None
        finally:
            conn.close()
        text = ans.body.decode("utf-8", errors="replace")
        if ans.status != 200:
            raise EngineError(f"--eval-server: {what}: HTTP {ans.status}: {_reason(text)}")
        if not as_json:
            return text
        try:
            return json.loads(text) if text.strip() else None
        except ValueError:
            raise EngineError(f"--eval-server: {what}: not JSON") from None

    def counters(self) -> Counters:
        return parse_counters(self.call("GET", "/metrics", as_json=False))

    # -- the run's start and end ---------------------------------------------------------------
    def open(self) -> str:
        """Read what the server serves now (to swap back at the end); a one-line description.
        EngineError when the server cannot be measured or left as it was."""
        models = self.call("GET", "/v1/models")
        data = models.get("data") if isinstance(models, dict) else None
        if not data or not isinstance(data[0], dict):
            raise EngineError(f"--eval-server {self.url}: /v1/models lists no model")
        self.model = str(data[0].get("id"))
        try:
            info = self.call("GET", "/weight_info")
        except EngineError as e:
            raise EngineError(f"--eval-server {self.url}: no weight-update routes ({e}); start "
                              "it with `eagle3-console serve` (VLLM_SERVER_DEV_MODE=1 and the "
                              "eagle3_drafter_dir backend)") from None
        version = str((info or {}).get("weight_version") or "default")
        if self.restore_folder:
            have = weight_version(self.restore_folder)
            if have != version and version != "default":
                raise EngineError(f"--eval-server-drafter {self.restore_folder}: its weight "
                                  f"version is {have}, the server serves {version}")
            folder = str(Path(self.restore_folder).resolve())
        elif version == "default":
            folder = self._started_with()
        else:
            raise EngineError(f"--eval-server {self.url}: serves {version} (a swapped drafter); "
                              "name its folder with --eval-server-drafter so the run can swap "
                              "it back")
        self.original = (folder, version)
        return f"{self.model} with drafter {folder} (weight version {version})"

    def _started_with(self) -> str:
        """The drafter folder the server started with (its speculative config)."""
        info = self.call("GET", "/server_info?config_format=json")
        cfg = (info or {}).get("vllm_config") if isinstance(info, dict) else None
        spec = cfg.get("speculative_config") if isinstance(cfg, dict) else None
        model = spec.get("model") if isinstance(spec, dict) else None
        if not isinstance(model, str) or not os.path.isdir(model):
            raise EngineError(f"--eval-server {self.url}: cannot tell which drafter folder it "
                              f"started with (speculative model {model!r}); name it with "
                              "--eval-server-drafter")
        return model

    def restore(self) -> str | None:
        """Swap the server's original drafter back (when a checkpoint is in it); its version."""
        if not self.swapped or self.original is None:
            return None
        folder, version = self.original
        self.swap(folder, version)
        self.swapped = False
        return version

    # -- one checkpoint ------------------------------------------------------------------------
    def swap(self, folder: str, version: str) -> float:
        """vLLM's route sequence; seconds taken. The backend reads the whole folder before it
        touches the model: a refusal leaves the drafter that served."""
        t0 = time.monotonic()
        try:
            self.call("POST", "/start_draft_weight_update", {})
        except EngineError as e:
            if "already active" not in str(e):
                raise
            # a swap that stopped between start and finish (a killed run) loaded nothing
            self.call("POST", "/finish_weight_update", {})
            self.call("POST", "/start_draft_weight_update", {})
        try:
            self.call("POST", "/update_weights", {"update_info": {"path": folder}},
                      deadline=SWAP_DEADLINE_S)
        except EngineError:
            # close the update, keeping the version that still serves
            with contextlib.suppress(EngineError):
                self.call("POST", "/finish_weight_update", {})
            raise
        self.call("POST", "/finish_weight_update", {"weight_version": version},
                  deadline=SWAP_DEADLINE_S)
        got = (self.call("GET", "/weight_info") or {}).get("weight_version")
        if got != version:
            raise EngineError(f"--eval-server {self.url}: /weight_info says {got!r} after the "
                              f"swap, not {version!r}")
        return time.monotonic() - t0

    def _one(self, prompt: list[int]) -> int:
        body = {"model": self.model, "prompt": prompt, "max_tokens": self.max_tokens,
                "temperature": 0}
        doc = self.call("POST", "/v1/completions", body)
        usage = (doc or {}).get("usage") or {}
        return int(usage.get("completion_tokens") or 0)

    def measure(self, folder: str) -> tuple[dict[str, float | int | None], str]:
        """Swap `folder` in, replay the prompts; (the figures, the weight version swapped in)."""
        if self.original is None:
            raise EngineError("--eval-server: measure before open")
        version = weight_version(folder)
        self.swapped = True  # from here on the end of the run swaps the original back
        swap_s = self.swap(str(Path(folder).resolve()), version)
        before = self.counters()
        t0 = time.monotonic()
        pool = ThreadPoolExecutor(CONCURRENCY)
        try:
            tokens = sum(pool.map(self._one, self.prompts))
        finally:  # a stop does not wait for the queued prompts: the swap back comes first
            pool.shutdown(wait=False, cancel_futures=True)
        replay_s = time.monotonic() - t0
        deadline = time.monotonic() + SETTLE_S
        after = self.counters()
        while after.generation_tokens - before.generation_tokens < tokens \
                and time.monotonic() < deadline:
            time.sleep(0.2)
            after = self.counters()
        out = figures(before, after)
        out.update(prompts=len(self.prompts), generated_tokens=tokens,
                   other_tokens=int(after.generation_tokens - before.generation_tokens - tokens),
                   swap_s=round(swap_s, 4), replay_s=round(replay_s, 3))
        return out, version


def _reason(text: str) -> str:
    """vLLM's own message in an error answer (its `error`, `detail` or `message`)."""
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        for key in ("error", "detail", "message"):
            v = doc.get(key)
            if isinstance(v, dict):
                v = v.get("message")
            if v:
                return str(v)[:500]
    return (text.strip().splitlines() or ["(no body)"])[0][:500]
