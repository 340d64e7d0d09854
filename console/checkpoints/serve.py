"""Serve a drafter in vLLM on a host, as a detached run (the serve dialog's and `serve`'s service).

    vllm serve VERIFIER --tensor-parallel-size N --port P \
        --speculative-config '{"method": "eagle3", "model": CKPT, "num_speculative_tokens": K}'

(vLLM's EAGLE-3 speculative config). Before anything starts, the checkpoint
is inspected on the host with the engine and refused, naming the failing check, when vLLM would
not load it: a failed inspect check, a speculators-style config without its verifier, or a
verifier whose config.json (read on the host when VERIFIER is a folder there) does not fit the
drafter's vocabulary, hidden size or aux layer ids. The command then runs like a profile launch
(runs.launch: registry, run.json, stop, follow), under a profile named `serve-<drafter>`, so a
second copy of the same drafter is refused unless forced.

Every serving session is also remembered on the workstation (`serving.jsonl` in the data dir):
drafter, its provenance (run, step), k, the metrics URL, start time; the comparison table reads it.
"""

from __future__ import annotations

import ast
import json
import posixpath
import re
import shlex
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from console.checkpoints.answers import ModelEntry
from console.checkpoints.drafter_facts import drafter_fields, flags_vllm_drops, verifier_mismatch
from console.checkpoints.journal import Provenance, Session, record
from console.checkpoints.serve_guard import (
    argv_port,
    check_extra,
    refuse_taken_port,
    serving_runs,
)
from console.checkpoints.serve_wait import CHECK_POLL, CHECK_TIMEOUT, OnWait, wait_until_served
from console.checkpoints.service import InspectReport, inspect_checkpoint
from console.errors import ConsoleError, TransportError
from console.hosts.host import Host, HostPool
from console.logs.vllm_log import strip_ansi
from console.runs.service import launch, list_runs
from console.scheduler.registry import Run
from console.settings.config import Config, Profile
from console.transport.small_files import json_why, read_small

# SpeculativeConfig fields vLLM documents (vllm/config/speculative.py); we write only these.
#: a config.json read whole on the host is at most this big (a real one is a few KB)
CONFIG_LIMIT = 4 << 20
SPEC_CONFIG_FIELDS = ("method", "model", "num_speculative_tokens", "draft_tensor_parallel_size")
LOADABLE_KEY_STYLES = ("eagle", "vllm", "speculators")
# engine/capture/swap_backend.py's names (the console never imports the engine's torch side)
SWAP_BACKEND = "eagle3_drafter_dir"
SWAP_EXTENSION = "engine.capture.swap_backend.SwapExtension"


@dataclass(frozen=True)
class ServeRequest:
    """What to serve: the drafter folder on the host and how vLLM runs it."""

    ckpt: str
    verifier: str
    tp: int = 1
    k: int = 3
    port: int = 8000
    extra: list[str] = field(default_factory=list)
    swappable: bool = True  # the weight-update routes and our drafter backend (`swap`)

    def check(self) -> None:
        if not self.verifier.strip():
            raise ConsoleError("verifier: give the target model's name or folder")
        if self.tp < 1:
            raise ConsoleError(f"--tp {self.tp}: must be >= 1")
        if not 1 <= self.k <= 16:
            raise ConsoleError(f"--k {self.k}: must be 1..16")
        if not 1024 <= self.port <= 65535:  # vLLM's own range
            raise ConsoleError(f"--port {self.port}: must be 1024..65535")
        check_extra(self.extra, self.swappable)


def speculative_config(req: ServeRequest) -> dict[str, Any]:
    return {"method": "eagle3", "model": req.ckpt, "num_speculative_tokens": req.k}


async def vllm_command(host: Host) -> list[str]:
    """How this host starts vLLM: its `vllm` setting (words, e.g. a venv's vllm or `python -m
    vllm.entrypoints.cli.main`), else the `vllm` beside the configured `python` (the venv that
    has the engine usually has vLLM too), else the `vllm` on the run's PATH. A bare `vllm`
    from the SSH session's PATH missed a venv's own (`cannot run vllm: No such file`)."""
    if host.cfg.vllm:
        return shlex.split(host.cfg.vllm)
    python = host.cfg.python
    if "/" in python:
        beside = posixpath.join(posixpath.dirname(python), "vllm")
        if (await host.transport.run(["test", "-x", beside])).ok:
            return [beside]
    return ["vllm"]


def vllm_argv(req: ServeRequest, command: Sequence[str] = ("vllm",)) -> list[str]:
    """The `vllm serve` command line (the run's argv on the host; `command` starts vLLM there:
    vllm_command), bound to its loopback: the console reaches it through the host's SSH
    connection; a swappable server also gets our drafter backend (engine/capture/
    swap_backend.py, registered by its worker extension)."""
    swap = ["--worker-extension-cls", SWAP_EXTENSION, "--weight-transfer-config",
            json.dumps({"backend": SWAP_BACKEND}, separators=(",", ":"))] if req.swappable \
        else []
    own = ["--tensor-parallel-size", str(req.tp), "--port", str(req.port),
           "--speculative-config", json.dumps(speculative_config(req), separators=(",", ":"))]
    if req.swappable:  # last: vLLM's parser lets no earlier word or --config file override it
        return [*command, "serve", req.verifier, *own, *swap, *req.extra, "--host", "127.0.0.1"]
    return [*command, "serve", req.verifier, "--host", "127.0.0.1", *own, *req.extra]


def vllm_env(req: ServeRequest) -> dict[str, str]:
    """The run's environment: dev mode mounts vLLM's weight-update routes (and its other
    development routes, hence the loopback)."""
    return {"VLLM_SERVER_DEV_MODE": "1"} if req.swappable else {}


def profile_name(ckpt: str) -> str:
    """serve-<drafter>: the folder name, with its run's id for a run output (.../RUN/out/final
    -> serve-RUN-final), so two drafters never share a name and one drafter always gets the same."""
    parts = [p for p in ckpt.rstrip("/").split("/") if p] or ["drafter"]
    base = parts[-1]
    if len(parts) >= 3 and parts[-2] == "out":
        base = f"{parts[-3]}-{base}"
    elif len(parts) >= 4 and parts[-2] == "checkpoints" and parts[-3] == "out":
        base = f"{parts[-4]}-{base}"
    return "serve-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in base)


def refusal(report: InspectReport) -> str | None:
    """Why vLLM would not load the inspected checkpoint, or None."""
    failed = report.first_failed()
    if failed is not None:
        return f"check {failed.name} failed: {failed.detail}"
    if report.key_style not in LOADABLE_KEY_STYLES:
        return f"key style {report.key_style!r} is not one vLLM loads"
    if report.config_style == "speculators" and not report.verifier:
        return "a speculators-style config needs its verifier (convert --to speculators " \
               "--verifier TARGET)"
    return None


async def check_servable(host: Host, req: ServeRequest) -> InspectReport:
    """The inspect report, after refusing (ConsoleError) what vLLM would not load."""
    req.check()
    report = await inspect_checkpoint(host, req.ckpt)
    why = refusal(report)
    if why:
        raise ConsoleError(f"{host.name}:{req.ckpt}: vLLM would not load it: {why}")
    looks_local = req.verifier.startswith(("/", "~", "."))
    path = await host.resolve(req.verifier) if looks_local else req.verifier
    cfg_path = posixpath.join(path, "config.json")
    try:
        data = await read_small(host.transport, cfg_path, CONFIG_LIMIT)
    except TransportError:  # FileRefused (a FIFO, /dev/zero, too big) is said as it is
        data = None
    if data is None:
        if looks_local:
            raise ConsoleError(f"{host.name}:{path}: no config.json (is the verifier a model "
                               f"folder?)")
        return report  # a hub name: vLLM resolves it; nothing to compare here
    try:
        target_cfg = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise ConsoleError(f"{host.name}:{cfg_path}: invalid JSON ({json_why(e)})") from None
    if not isinstance(target_cfg, dict):
        raise ConsoleError(f"{host.name}:{cfg_path}: not a JSON object")
    why = verifier_mismatch(dict(report.config), target_cfg)
    if why:
        raise ConsoleError(f"{host.name}:{req.ckpt}: does not fit verifier {path}: {why}")
    return report


def session_provenance(report: InspectReport) -> Provenance:
    """What the comparison tells drafters apart by, from the provenance `engine inspect`
    reported (a converted drafter's run and step come from the training record its conversion
    carried over, `origin`)."""
    return Provenance.of_inspect(report.data)


async def serve(config: Config, host_name: str, req: ServeRequest, pool: HostPool, *,
                force: bool = False) -> Run:
    """Check, then start `vllm serve` detached on the host; records the serving session."""
    host = await pool.ensure(host_name)
    req = replace(req, ckpt=await host.resolve(req.ckpt))
    report = await check_servable(host, req)
    name = profile_name(req.ckpt)
    records = await list_runs(host)
    same = [r for r in serving_runs(records) if r.profile == name]
    if same and not force:
        rec = same[0]
        raise ConsoleError(f"{host_name}: {req.ckpt} is already served by run {rec.id} (port "
                           f"{argv_port(rec.argv)}); stop it (`eagle3-console stop {rec.id}`), "
                           "or serve a second copy with --force and another --port")
    await refuse_taken_port(host, req.port, records)
    profile = Profile(name=name, hosts=[host_name],
                      run=shlex.join(vllm_argv(req, await vllm_command(host))),
                      env=vllm_env(req))
    run = await launch(replace(config, profiles={**config.profiles, name: profile}), name, pool,
                       force=force)
    record(Session(run_id=run.id, host=host_name, drafter=req.ckpt, verifier=req.verifier,
                   k=req.k, tp=req.tp, port=req.port,
                   metrics=f"http://127.0.0.1:{req.port}/metrics",
                   provenance=session_provenance(report), format=report.format or None,
                   draft_vocab_size=report.draft_vocab_size, started=time.time(),
                   swappable=req.swappable, extra=tuple(req.extra)))
    return run


# -- what vLLM actually loaded --------------------------------------------------------------------
#
# Fields of a drafter have reached vLLM silently wrong before (a field dropped on the way, e.g.
# norm_before_fc; acceptance lower, nothing logged: docs/eagle3.md#how-the-serving-engines-load). So
# once the server answers, the run's output.log and /v1/models are read back and compared with
# what was asked. What vLLM 0.32 prints about the speculative config (recorded from a real
# server in tests/fixtures/vllm/serve-0.32.0-cpu.log):
#
#   (EngineCore pid=N) INFO ... [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config:
#       model='TARGET', speculative_config=SpeculativeConfig(method='eagle3', model='DRAFTER',
#       num_spec_tokens=3), tokenizer=...
#   (Worker pid=N) INFO ... [gpu_model_runner.py:5243] Using auxiliary layers from speculative
#       config: (1, 3, 5)
#
# The second line is printed only when the drafter's config names its aux layer ids; without
# them vLLM captures the target's defaults and says nothing. norm_before_fc, norm_output and
# the draft vocab size are not printed at all, and /v1/models names only the target (id,
# root, max_model_len): those fields are reported as "not shown by vLLM", never as a warning.

#: the startup log is read up to here (its config lines come in the first few hundred KB)
LOG_LIMIT = 8 << 20
NOT_SHOWN = "not shown by vLLM"
#: from this version on vLLM logs the aux layer ids it takes from the drafter's config (added in
#: vllm PR 25961, autumn 2025); before it, the line's absence says nothing
AUX_LOGGED_SINCE = (0, 12, 0)

_SPEC_REPR = re.compile(r"speculative_config=(None|SpeculativeConfig\((.*?)\))(?=,\s*\w+=|\s*$)")
_SPEC_PAIR = re.compile(r"(\w+)=('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^,]*)")
_AUX = re.compile(r"Using auxiliary layers from speculative config: \(([\d,\s]*)\)")
_VERSION = re.compile(r"(?:\bversion |LLM engine \(v)(\d+\.\d+\.\d+)")
_READY = ("Starting vLLM server on", "Application startup complete")


@dataclass(frozen=True)
class StartupLog:
    """What a vLLM server's output log says about the speculative config it loaded."""

    version: str | None                     # "0.32.0" (banner, or the engine's config line)
    spec: dict[str, Any] | None             # SpeculativeConfig(...) as printed; {} for None
    aux_layer_ids: tuple[int, ...] | None   # "Using auxiliary layers from speculative config"
    ready: bool                             # the API server started (all config lines are in)

    @property
    def version_tuple(self) -> tuple[int, ...] | None:
        return tuple(int(x) for x in self.version.split(".")) if self.version else None


def _literal(text: str) -> Any:
    text = text.strip()
    if text[:1] in "'\"":
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text[1:-1]
    if text == "None":
        return None
    return int(text) if text.isdigit() else text


def parse_startup_log(lines: Iterable[str]) -> StartupLog:
    """The speculative config a vLLM log prints while it starts (pure; ANSI colours ignored).
    The first of each line counts (each data-parallel engine and TP worker prints its own)."""
    version: str | None = None
    spec: dict[str, Any] | None = None
    aux: tuple[int, ...] | None = None
    ready = False
    for raw in lines:
        line = strip_ansi(raw)
        if version is None and (m := _VERSION.search(line)):
            version = m.group(1)
        if spec is None and "speculative_config=" in line and (m := _SPEC_REPR.search(line)):
            spec = {} if m.group(1) == "None" else {
                k: _literal(v) for k, v in _SPEC_PAIR.findall(m.group(2) or "")}
        if aux is None and (m := _AUX.search(line)):
            aux = tuple(int(x) for x in m.group(1).replace(",", " ").split())
        ready = ready or any(marker in line for marker in _READY)
    if spec is not None:  # older releases: draft_model=, num_speculative_tokens=
        if "model" not in spec and "draft_model" in spec:
            spec["model"] = spec["draft_model"]
        if "num_spec_tokens" not in spec and "num_speculative_tokens" in spec:
            spec["num_spec_tokens"] = spec["num_speculative_tokens"]
    return StartupLog(version=version, spec=spec, aux_layer_ids=aux, ready=ready)


@dataclass(frozen=True)
class FieldCheck:
    """One asked field against what vLLM shows of it."""

    field: str
    asked: Any
    served: Any
    source: str    # where `served` comes from: "log", "/v1/models", or "" (nowhere)
    status: str    # ok | mismatch | missing | not shown by vLLM | not checked

    @property
    def warning(self) -> str | None:
        """One line, for a field that did not reach vLLM as asked (None when it did or when
        vLLM does not show it)."""
        if self.status == "mismatch":
            return f"{self.field}: asked {self.asked!r}, vLLM loaded {self.served!r} " \
                   f"({self.source})"
        if self.status == "missing":
            return f"{self.field}: asked {self.asked!r}, not in vLLM's {self.source} " \
                   f"({self.served})"
        return None


@dataclass(frozen=True)
class ServedCheck:
    """What vLLM loaded, field by field, and the warnings for what did not reach it."""

    run_id: str
    ready: bool                    # the server answered /v1/models
    version: str | None
    fields: list[FieldCheck]
    problems: list[str]            # why some fields could not be checked
    models: list[ModelEntry]       # /v1/models' entries: id, root, max_model_len

    @property
    def warnings(self) -> list[str]:
        return self.problems + [w for f in self.fields if (w := f.warning)]

    @property
    def not_shown(self) -> list[str]:
        return [f.field for f in self.fields if f.status == NOT_SHOWN]

    def summary(self) -> str:
        """One line: what vLLM was seen to load, and what it does not show."""
        seen = ", ".join(f"{f.field} {f.asked if f.served is None else f.served!r}"
                         for f in self.fields if f.status == "ok")
        out = f"vLLM {self.version or '?'} loaded: {seen or 'nothing checked'}"
        return out + (f"; {NOT_SHOWN}: {', '.join(self.not_shown)}" if self.not_shown else "")

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "ready": self.ready, "version": self.version,
                "fields": [asdict(f) for f in self.fields], "warnings": self.warnings,
                "not_shown_by_vllm": self.not_shown,
                "models": [m.to_json() for m in self.models]}


def _same_path(a: Any, b: Any) -> bool:
    return isinstance(a, str) and isinstance(b, str) and \
        posixpath.normpath(a) == posixpath.normpath(b)


def compare_served(req: ServeRequest, draft_cfg: dict[str, Any], log: StartupLog | None,
                   models: list[ModelEntry] | None) -> list[FieldCheck]:
    """Each asked field against the log and /v1/models (pure). req carries resolved paths.
    A source that is None was not read: its fields are `not checked`; so is a field absent
    from a log that does not show the server started (it may not have come to that line)."""
    out: list[FieldCheck] = []

    def put(name: str, asked: Any, served: Any, source: str, same: bool, shown: bool) -> None:
        if source == "log" and log is None or source == "/v1/models" and models is None:
            status = "not checked"
        elif not shown:
            status = "missing" if source != "log" or log is not None and log.ready \
                else "not checked"
        else:
            status = "ok" if same else "mismatch"
        out.append(FieldCheck(name, asked, served, source, status))

    spec = None if log is None else log.spec
    shown = spec is not None and bool(spec)
    why = "no speculative config: speculative decoding is off" if spec == {} else \
        "no SpeculativeConfig(...) in its config line"
    for name, key, asked in (("method", "method", "eagle3"), ("model", "model", req.ckpt),
                             ("num_speculative_tokens", "num_spec_tokens", req.k)):
        got = spec[key] if spec and key in spec else None
        same = _same_path(asked, got) if name == "model" else got == asked
        put(name, asked, got if shown else why, "log", same, shown and key in (spec or {}))
    roots = [m.served for m in models or []]
    put("verifier", req.verifier, roots[0] if roots else "no model listed", "/v1/models",
        any(_same_path(req.verifier, r) or r == req.verifier for r in roots), bool(roots))
    want = drafter_fields(draft_cfg)
    aux = want["aux_layer_ids"]
    got_aux = None if log is None or log.aux_layer_ids is None else list(log.aux_layer_ids)
    logs_aux = log is not None and (log.version_tuple or (0,)) >= AUX_LOGGED_SINCE
    if aux is None:  # the target's defaults: vLLM says nothing when it picks them
        out.append(FieldCheck("aux_layer_ids", "the target's defaults", got_aux, "log",
                              "not checked" if log is None or not log.ready and got_aux is None
                              else "ok" if got_aux is None else "mismatch"))
    elif got_aux is None and not logs_aux and log is not None:
        out.append(FieldCheck("aux_layer_ids", aux, None, "", NOT_SHOWN))
    else:
        put("aux_layer_ids", aux, got_aux if got_aux is not None else
            "no 'Using auxiliary layers from speculative config' line: vLLM captures the "
            "target's default layers", "log", got_aux == aux, got_aux is not None)
    dropped = {name: (asked, took) for name, asked, took in flags_vllm_drops(draft_cfg)}
    for name in ("norm_before_fc", "fc_norm", "norm_output", "draft_vocab_size"):
        if name in dropped:  # not printed by vLLM, but where it reads the config it is not
            out.append(FieldCheck(name, dropped[name][0], dropped[name][1],
                                  "config.json (eagle_config only; vLLM reads the top level)",
                                  "mismatch"))
        elif name in want:
            out.append(FieldCheck(name, want[name], None, "", NOT_SHOWN))
    return out


async def read_startup_log(host: Host, run: Run) -> StartupLog | None:
    """The speculative config in the run's output.log (None when it cannot be read)."""
    rec = run.records[0] if run.records else None
    if rec is None or not rec.run_dir:
        return None
    try:
        data = await host.transport.read_range(posixpath.join(rec.run_dir, "output.log"), 0,
                                               LOG_LIMIT)
    except TransportError:
        return None
    return parse_startup_log(data.decode("utf-8", errors="replace").splitlines())


async def check_served(host: Host, req: ServeRequest, run: Run, *,
                       timeout: float = CHECK_TIMEOUT, poll: float = CHECK_POLL,
                       on_wait: OnWait | None = None) -> ServedCheck:
    """Wait for the started server (on_wait: each poll, the seconds waited and the last line
    of its log), then compare what it loaded with what was asked."""
    await host.connect()
    # as serve() wrote them into the command line: the drafter resolved, the verifier as given
    req = replace(req, ckpt=await host.resolve(req.ckpt))
    models, why = await wait_until_served(host, run, req.port, timeout, poll, on_wait)
    log = await read_startup_log(host, run)
    try:
        data = await read_small(host.transport, posixpath.join(req.ckpt, "config.json"),
                                CONFIG_LIMIT)
        draft_cfg = json.loads(data) if data is not None else {}
    except (ConsoleError, ValueError, RecursionError):
        draft_cfg = {}  # inspect read it before the start; the fields are then "not checked"
    problems = [f"served config not fully checked: {why}"] if why else []
    if log is None:
        problems.append("served config not checked in the log: the run's output.log cannot "
                        "be read")
    elif models is not None and not log.ready:
        problems.append("vLLM answers /v1/models but its log shows no startup: the log may "
                        "be another server's")
    return ServedCheck(run_id=run.id, ready=models is not None,
                       version=log.version if log else None,
                       fields=compare_served(req, draft_cfg if isinstance(draft_cfg, dict)
                                             else {}, log, models),
                       problems=problems, models=models or [])
