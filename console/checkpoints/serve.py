"""Serve a drafter in vLLM on a host, as a detached run (the serve dialog's and `serve`'s service).

    vllm serve VERIFIER --tensor-parallel-size N --port P \
        --speculative-config '{"method": "eagle3", "model": CKPT, "num_speculative_tokens": K}'

(spec sheet section 4, "How the serving engines load"). Before anything starts, the checkpoint
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

import json
import os
import posixpath
import shlex
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from console.checkpoints.service import inspect_checkpoint
from console.errors import ConsoleError
from console.hosts.host import Host
from console.runs.service import launch
from console.scheduler.records import Run
from console.settings.config import Config, Profile, data_dir

# SpeculativeConfig fields vLLM documents (vllm/config/speculative.py); we write only these.
SPEC_CONFIG_FIELDS = ("method", "model", "num_speculative_tokens", "draft_tensor_parallel_size")
LOADABLE_KEY_STYLES = ("eagle", "vllm", "speculators")


@dataclass(frozen=True)
class ServeRequest:
    """What to serve: the drafter folder on the host and how vLLM runs it."""

    ckpt: str
    verifier: str
    tp: int = 1
    k: int = 3
    port: int = 8000
    extra: list[str] = field(default_factory=list)

    def check(self) -> None:
        if not self.verifier.strip():
            raise ConsoleError("verifier: give the target model's name or folder")
        if self.tp < 1:
            raise ConsoleError(f"--tp {self.tp}: must be >= 1")
        if not 1 <= self.k <= 16:
            raise ConsoleError(f"--k {self.k}: must be 1..16")
        if not 1 <= self.port <= 65535:
            raise ConsoleError(f"--port {self.port}: must be 1..65535")


def speculative_config(req: ServeRequest) -> dict[str, Any]:
    return {"method": "eagle3", "model": req.ckpt, "num_speculative_tokens": req.k}


def vllm_argv(req: ServeRequest) -> list[str]:
    """The `vllm serve` command line (the run's argv on the host)."""
    return ["vllm", "serve", req.verifier, "--tensor-parallel-size", str(req.tp),
            "--port", str(req.port), "--speculative-config",
            json.dumps(speculative_config(req), separators=(",", ":")), *req.extra]


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


def refusal(report: dict[str, Any]) -> str | None:
    """Why vLLM would not load the inspected checkpoint, or None."""
    for c in report.get("checks") or []:
        if not c.get("ok"):
            return f"check {c.get('name')} failed: {c.get('detail')}"
    if report.get("key_style") not in LOADABLE_KEY_STYLES:
        return f"key style {report.get('key_style')!r} is not one vLLM loads"
    cfg = report.get("config") or {}
    if report.get("config_style") == "speculators" and not cfg.get("verifier"):
        return "a speculators-style config needs its verifier (convert --to speculators " \
               "--verifier TARGET)"
    return None


def verifier_mismatch(draft_cfg: dict[str, Any], target_cfg: dict[str, Any]) -> str | None:
    """Which field of the verifier's config.json does not fit the drafter, or None."""
    t = {**target_cfg, **(target_cfg.get("text_config") or {})}
    if "kv_lora_rank" in t and "vocab_size" not in t:
        return None
    pairs = (("vocab_size", draft_cfg.get("vocab_size"), t.get("vocab_size")),
             ("hidden_size", draft_cfg.get("target_hidden_size") or draft_cfg.get("hidden_size"),
              t.get("hidden_size")))
    for name, want, got in pairs:
        if want is not None and got is not None and want != got:
            return f"{name}: the drafter expects {want}, the verifier has {got}"
    n = t.get("num_hidden_layers")
    ids = draft_cfg.get("aux_layer_ids") or []
    if isinstance(n, int) and any(not 0 <= int(i) <= n for i in ids):
        return f"aux layer ids {ids} do not fit the verifier's {n} layers"
    return None


async def check_servable(host: Host, req: ServeRequest) -> dict[str, Any]:
    """The inspect report, after refusing (ConsoleError) what vLLM would not load."""
    req.check()
    report = await inspect_checkpoint(host, req.ckpt)
    why = refusal(report)
    if why:
        raise ConsoleError(f"{host.name}:{req.ckpt}: vLLM would not load it: {why}")
    looks_local = req.verifier.startswith(("/", "~", "."))
    path = await host.resolve(req.verifier) if looks_local else req.verifier
    res = await host.transport.run(["cat", posixpath.join(path, "config.json")], check=False)
    if res.returncode != 0:
        if looks_local:
            raise ConsoleError(f"{host.name}:{path}: no config.json (is the verifier a model "
                               f"folder?)")
        return report  # a hub name: vLLM resolves it; nothing to compare here
    try:
        target_cfg = json.loads(res.stdout)
    except ValueError as e:
        raise ConsoleError(f"{host.name}:{path}/config.json: invalid JSON ({e})") from e
    why = verifier_mismatch(report.get("config") or {}, target_cfg)
    if why:
        raise ConsoleError(f"{host.name}:{req.ckpt}: does not fit verifier {path}: {why}")
    return report


async def read_provenance(host: Host, ckpt: str) -> dict[str, Any]:
    """The drafter's provenance.json, cut to what tells drafters apart (run, step, source)."""
    res = await host.transport.run(["cat", posixpath.join(ckpt, "provenance.json")], check=False)
    try:
        prov = json.loads(res.stdout) if res.returncode == 0 else {}
    except ValueError:
        prov = {}
    if not isinstance(prov, dict):
        return {}
    keep = {k: prov[k] for k in ("run", "step", "source", "format") if prov.get(k) is not None}
    ft = prov.get("finetune")
    if isinstance(ft, dict) and ft.get("path"):
        keep["finetune"] = {"path": ft["path"]}  # not its per-file digests: a table cell
    return keep


def sessions_path() -> Path:
    return data_dir() / "serving.jsonl"


def record_session(entry: dict[str, Any]) -> None:
    """Append one serving session (a line; appends of one line are atomic enough here)."""
    p = sessions_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_sessions() -> list[dict[str, Any]]:
    """Every recorded serving session, oldest first (malformed lines skipped)."""
    try:
        lines = sessions_path().read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict):
            out.append(d)
    return out


async def serve(config: Config, host_name: str, req: ServeRequest, pool: dict[str, Host], *,
                force: bool = False) -> Run:
    """Check, then start `vllm serve` detached on the host; records the serving session."""
    host = pool[host_name]
    await host.connect()
    req = replace(req, ckpt=await host.resolve(req.ckpt))
    report = await check_servable(host, req)
    name = profile_name(req.ckpt)
    profile = Profile(name=name, hosts=[host_name], run=shlex.join(vllm_argv(req)))
    run = await launch(replace(config, profiles={**config.profiles, name: profile}), name, pool,
                       force=force)
    prov = await read_provenance(host, req.ckpt)
    record_session({"run_id": run.id, "host": host_name, "drafter": req.ckpt,
                    "verifier": req.verifier, "k": req.k, "tp": req.tp, "port": req.port,
                    "metrics": f"http://127.0.0.1:{req.port}/metrics", "provenance": prov,
                    "format": report.get("format"),
                    "draft_vocab_size": (report.get("config") or {}).get("draft_vocab_size"),
                    "started": time.time(), "request": asdict(req)})
    return run
