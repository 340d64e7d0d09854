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
whose version must match; a folder given for "default" must be the server's speculative model,
by path or by the sha256 of its weights) is swapped back at the end of the run, on a stop
(SIGTERM) and on a failure, with its own weight version: the server is left as it was found.
RUN/served/eval-server.json remembers that drafter and every version the run swapped in, so a
resumed run that finds one of its own checkpoints in the server (a run killed mid-swap) swaps
the original back without being told.

What the server answers is data: a fault of the server (an error, a bad status line, a stall,
an answer too large, JSON of the wrong shape, a non-finite counter) is an EngineError naming the
request, and one measurement (the swap in, the replay, the counters) ends by its deadline
(`--eval-server-deadline`), as the swap back does by its own. Standard library HTTP only
(engine/bounded_http.py: every request has a deadline and a size cap).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import math
import os
import re
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import stop_hold
from engine.bounded_http import (
    AnswerTooLarge,
    DeadlineExceeded,
    connection,
    error_reason,
    send,
)
from engine.errors import EngineError
from engine.fileio import read_json, sha256_file, write_json

LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: requests in flight during a replay (the figures are counted by vLLM, whatever the batching)
CONCURRENCY = 8
#: how long vLLM's counters may lag the last answer (it records stats after sending outputs)
SETTLE_S = 10.0
#: one measurement (swap in, replay, counters), and the swap back: a swap reads the whole
#: drafter on the server, minutes for a large one (train --eval-server-deadline)
DEADLINE_S = 900.0
#: what the run remembers of the server across its attempts (RUN/served/)
STATE = "eval-server.json"
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
    """The counters of a Prometheus text page (other lines ignored; pure). ValueError naming a
    counter we read that is not a finite count."""
    c = Counters()
    for line in text.splitlines():
        m = COUNTER.match(line)
        if m is None or m[1].endswith("_created"):
            continue
        try:
            value = float(m[3])
        except ValueError:
            continue
        if (m[1] in NAMES or m[1] == PER_POSITION) and not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{m[1]} is {m[3]}, not a count")
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
                 restore_folder: str | None = None, deadline_s: float = DEADLINE_S,
                 state_dir: str | Path | None = None, resume: bool = False) -> None:
        self.url = check_url(url)
        self.prompts, self.max_tokens = prompts, max_tokens
        self.restore_folder = restore_folder
        self.deadline_s = deadline_s
        self.state = Path(state_dir) / STATE if state_dir is not None else None
        self.resume = resume
        self.original: tuple[str, str] | None = None   # (folder, weight version) to swap back
        self.swapped = False                            # a checkpoint may be in the server now
        self.given_up = False                           # a swap back failed: not tried again
        self.ours: list[str] = []                       # the versions this run swapped in
        self.confirmed = ""                             # the last one /weight_info confirmed
        self.model = ""
        self._end: float | None = None                  # the running deadline (monotonic)
        self._what = ""                                 # and what it bounds

    # -- HTTP ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def within(self, what: str) -> Iterator[None]:
        """Every request inside ends by `deadline_s` from now; `what` is named when it passes."""
        self._end, self._what = time.monotonic() + self.deadline_s, what
        try:
            yield
        finally:
            self._end = None

    def _passed(self) -> str:
        return (f"no answer within {self._what}'s deadline ({self.deadline_s:g} s, "
                "--eval-server-deadline)")

    def call(self, method: str, path: str, body: Any = None, as_json: bool = True) -> Any:
        """One request's answer (JSON, or text); EngineError naming the request and what went
        wrong (vLLM's reason, a broken answer, the deadline)."""
        what = f"{method} {self.url}{path}"
        end = self._end if self._end is not None else time.monotonic() + self.deadline_s
        deadline = end - time.monotonic()
        if deadline <= 0:
            raise EngineError(f"--eval-server: {what}: {self._passed()}")
        data = None if body is None else json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json"} if data is not None else {}
        conn = connection(self.url, deadline)
        try:
            ans = send(conn, method, path, data, headers, deadline)
        except DeadlineExceeded:
            raise EngineError(f"--eval-server: {what}: {self._passed()}") from None
        except (OSError, http.client.HTTPException, AnswerTooLarge) as e:
            raise EngineError(f"--eval-server: {what}: {_fault(e)}") from None
        finally:
            conn.close()
        if ans.status != 200:
            raise EngineError(f"--eval-server: {what}: HTTP {ans.status}: "
                              f"{error_reason(ans.body)}")
        text = ans.body.decode("utf-8", errors="replace")
        if not as_json:
            return text
        try:
            return json.loads(text) if text.strip() else None
        except (ValueError, RecursionError):
            raise EngineError(f"--eval-server: {what}: not JSON") from None

    def counters(self) -> Counters:
        try:
            return parse_counters(self.call("GET", "/metrics", as_json=False))
        except ValueError as e:
            raise EngineError(f"--eval-server: GET {self.url}/metrics: {e}") from None

    def served_version(self) -> str:
        """The weight version /weight_info names ("default": the drafter it started with)."""
        info = self.call("GET", "/weight_info")
        got = info.get("weight_version") if isinstance(info, dict) else None
        if got is not None and not isinstance(got, str):
            raise EngineError(f"--eval-server: GET {self.url}/weight_info: weight_version "
                              f"{_show(got)} is not a name")
        return got or "default"

    # -- the run's start and end ---------------------------------------------------------------
    def open(self) -> str:
        """Read what the server serves now (to swap back at the end); a one-line description.
        EngineError when the server cannot be measured or left as it was."""
        with self.within("reading what it serves"):
            models = self.call("GET", "/v1/models")
            data = models.get("data") if isinstance(models, dict) else None
            first = data[0] if isinstance(data, list) and data else None
            if not isinstance(first, dict) or not isinstance(first.get("id"), str):
                raise EngineError(f"--eval-server {self.url}: /v1/models lists no model")
            self.model = first["id"]
            try:
                version = self.served_version()
            except EngineError as e:
                raise EngineError(f"--eval-server {self.url}: no weight-update routes ({e}); "
                                  "start it with `eagle3-console serve` "
                                  "(VLLM_SERVER_DEV_MODE=1 and the eagle3_drafter_dir "
                                  "backend)") from None
            if self._remembered(version):
                assert self.original is not None
                folder, orig = self.original
                if self.swapped:
                    return (f"{self.model} with {version}, a checkpoint of this run: its "
                            f"drafter {folder} (weight version {orig}) is swapped back")
                return f"{self.model} with drafter {folder} (weight version {orig})"
            if self.restore_folder:
                folder = str(Path(self.restore_folder).resolve())
                if version == "default":
                    self._check_default(folder)
                else:
                    have = weight_version(folder)
                    if have != version:
                        raise EngineError(f"--eval-server-drafter {self.restore_folder}: its "
                                          f"weight version is {have}, the server serves "
                                          f"{version}")
            elif version == "default":
                folder = self._started_with()
            else:
                raise EngineError(f"--eval-server {self.url}: serves {version} (a swapped "
                                  "drafter); name its folder with --eval-server-drafter so the "
                                  "run can swap it back")
        self.original = (folder, version)
        self._remember(restored=True)
        return f"{self.model} with drafter {folder} (weight version {version})"

    def _speculative_model(self) -> object:
        """What /server_info says of the drafter the server started with (its path)."""
        info = self.call("GET", "/server_info?config_format=json")
        cfg = info.get("vllm_config") if isinstance(info, dict) else None
        spec = cfg.get("speculative_config") if isinstance(cfg, dict) else None
        return spec.get("model") if isinstance(spec, dict) else None

    def _started_with(self) -> str:
        """The drafter folder the server started with (its speculative config)."""
        model = self._speculative_model()
        if not isinstance(model, str) or not os.path.isdir(model):
            raise EngineError(f"--eval-server {self.url}: cannot tell which drafter folder it "
                              f"started with (speculative model {_show(model)}); name it with "
                              "--eval-server-drafter")
        return model

    def _check_default(self, folder: str) -> None:
        """A folder named for the drafter the server started with must be that drafter: its
        speculative model's path, or the same weights (a copy)."""
        model = self._speculative_model()
        if not isinstance(model, str) or not model:
            raise EngineError(f"--eval-server-drafter {folder}: the server serves the drafter "
                              f"it started with and does not say which (speculative model "
                              f"{_show(model)} in /server_info): cannot check it is this one")
        if os.path.realpath(model) == os.path.realpath(folder):
            return
        same = False
        if os.path.isdir(model):
            with contextlib.suppress(EngineError):
                same = _digest(model) == _digest(folder)
        if not same:
            raise EngineError(f"--eval-server-drafter {folder}: the server serves {model} (the "
                              "drafter it started with, weight version default), not this "
                              "folder: neither its path nor its weights; name that folder, or "
                              "leave the option out")

    def _remembered(self, version: str) -> bool:
        """A resumed run that finds the drafter it recorded at its first start, or one of its
        own checkpoints (swapped in before a kill): the recorded drafter is the original."""
        if not self.resume or self.state is None or not self.state.is_file():
            return False
        doc = read_json(self.state)
        orig = doc.get("original")
        ours = doc.get("swapped_in")
        if not (isinstance(orig, dict) and isinstance(orig.get("folder"), str)
                and isinstance(orig.get("version"), str) and isinstance(ours, list)
                and all(isinstance(v, str) for v in ours)):
            raise EngineError(f"{self.state}: not the run's record of its eval server (delete "
                              "it and name the server's drafter with --eval-server-drafter)")
        if doc.get("url") != self.url or version not in (orig["version"], *ours):
            return False   # another server, or someone else swapped: the usual rules
        folder, orig_version = orig["folder"], orig["version"]
        if orig_version == "default":
            self._check_default(folder)
        else:
            have = weight_version(folder)
            if have != orig_version:
                raise EngineError(f"{self.state}: the drafter the server served, {folder}, is "
                                  f"{have} now, not {orig_version}: swap it back by hand")
        self.original, self.ours = (folder, orig_version), list(ours)
        self.swapped = version != orig_version or doc.get("restored") is not True
        return True

    def _remember(self, restored: bool) -> None:
        """RUN/served/eval-server.json: the original drafter, the versions swapped in."""
        if self.state is None or self.original is None:
            return
        folder, version = self.original
        try:
            self.state.parent.mkdir(parents=True, exist_ok=True)
            write_json(self.state, {"url": self.url,
                                    "original": {"folder": folder, "version": version},
                                    "swapped_in": self.ours[-200:], "restored": restored})
        except OSError as e:
            raise EngineError(f"{self.state}: cannot record the eval server's drafter "
                              f"({e.strerror or e})") from None

    def left_note(self) -> str:
        """What the server serves and should serve, while a checkpoint may be in it."""
        folder, version = self.original or ("?", "?")
        now = self.confirmed or (self.ours[-1] if self.ours else "a checkpoint")
        return (f"the eval server {self.url} may still serve {now} (a checkpoint of this run); "
                f"it should serve {folder} (weight version {version}): resume the run (it "
                "swaps it back first) or swap that folder in by hand")

    def hold_stop(self, margin_s: float, *, from_stop: bool = False) -> None:
        """While a checkpoint may be in the server, a stop gives the run time to swap the
        drafter back (engine/stop_hold.py; from_stop: counted from the stop's SIGTERM, so a slow
        training step between the signal and the swap back is covered too)."""
        folder = self.original[0] if self.original else "?"
        stop_hold.hold(self.deadline_s + margin_s, f"swapping the eval server's drafter back: "
                       f"{self.url} gets {folder}", self.left_note(), from_stop=from_stop)

    def restore(self) -> str | None:
        """Swap the server's original drafter back (when a checkpoint is in it); its version.
        Tried once: a second try after a failure would only wait for the same fault."""
        if not self.swapped or self.original is None or self.given_up:
            return None
        folder, version = self.original
        try:
            with self.within("the swap back"):
                self.swap(folder, version)
        except EngineError:
            self.given_up = True
            raise
        self.swapped = False
        with contextlib.suppress(EngineError):  # the server is right; only the note is stale
            self._remember(restored=True)
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
            self.call("POST", "/update_weights", {"update_info": {"path": folder}})
        except EngineError:
            # close the update, keeping the version that still serves
            with contextlib.suppress(EngineError):
                self.call("POST", "/finish_weight_update", {})
            raise
        self.call("POST", "/finish_weight_update", {"weight_version": version})
        got = self.served_version()
        if got != version:
            raise EngineError(f"--eval-server {self.url}: /weight_info says {got!r} after the "
                              f"swap, not {version!r}")
        self.confirmed = version
        return time.monotonic() - t0

    def _one(self, prompt: list[int]) -> int:
        body = {"model": self.model, "prompt": prompt, "max_tokens": self.max_tokens,
                "temperature": 0}
        doc = self.call("POST", "/v1/completions", body)
        if not isinstance(doc, dict):
            raise EngineError(f"--eval-server: POST {self.url}/v1/completions: the answer is "
                              f"{type(doc).__name__}, not a JSON object")
        usage = doc.get("usage")
        n = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self.max_tokens:
            raise EngineError(f"--eval-server: POST {self.url}/v1/completions: usage."
                              f"completion_tokens is {_show(n)}, not a count up to "
                              f"{self.max_tokens}")
        return n

    def measure(self, folder: str) -> tuple[dict[str, float | int | None], str]:
        """Swap `folder` in, replay the prompts; (the figures, the weight version swapped in).
        Within one deadline (`deadline_s`) for all of it."""
        if self.original is None:
            raise EngineError("--eval-server: measure before open")
        version = weight_version(folder)
        self.ours.append(version)
        self._remember(restored=False)  # before the swap: a resumed run knows it as its own
        self.swapped = True  # from here on the end of the run swaps the original back
        with self.within("the measurement"):
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


def _digest(folder: str) -> str:
    """The sha256 part of a folder's weight version (its weights, whatever its name)."""
    return weight_version(folder).split("@", 1)[1]


def _show(value: object) -> str:
    """A server's value in a message: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _fault(e: BaseException) -> str:
    """A broken answer in one line: what broke and the first of its words."""
    words = str(e).strip().splitlines()
    return f"{type(e).__name__}" + (f": {words[0][:200]}" if words else "")
