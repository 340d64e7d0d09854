"""The stand-in `vllm serve` of tests/console/checkpoints/test_serve.py: a script on PATH that
records its argv, prints the startup log a real vLLM 0.32 printed (with this run's paths, k and
aux ids) and answers /v1/models and /metrics on its --port. Its own module, light to import (no
torch, no pytest): the served-config check waits only seconds for that log, and a stand-in that
first imported the test file (torch, through tests/drafters.py) missed it on a loaded machine."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

from console.checkpoints.drafter_facts import drafter_fields
from tests.paths import REPO

STANDIN = """#!/bin/sh
# stand-in vllm: record argv (a JSON list beside this script), then print a vLLM 0.32 startup
# log and serve /v1/models and Prometheus /metrics on its --port (standin_main below) until
# signalled
"{python}" - "$0" "$@" <<'PY'
import json, os, sys
json.dump(sys.argv[2:], open(sys.argv[1] + ".argv", "w"))
json.dump({k: v for k, v in os.environ.items() if k.startswith("EAGLE3_HOST_")},
          open(sys.argv[1] + ".env", "w"))
PY
cd "{repo}" && exec "{python}" -c "import sys; from tests.vllm_serve_standin import standin_main; \\
standin_main(sys.argv[1], sys.argv[2:])" "$0" "$@"
"""
FIXTURES = REPO / "tests" / "fixtures" / "vllm"
REAL_LOG = FIXTURES / "serve-0.32.0-cpu.log"
REAL_MODELS = FIXTURES / "models-0.32.0-cpu.json"
#: what the recorded server was started with (RECORDED.md)
REC_TARGET, REC_DRAFTER, REC_PORT = "/tmp/served-check/target", "/tmp/served-check/drafter", 8811


def standin_log(argv: list[str], drop: set[str]) -> str:
    """The recorded vLLM 0.32 startup log with this command line's paths, k and port, and the
    drafter's aux ids; `drop`: aux (no aux line: vLLM took the defaults), spec (no speculative
    config: vLLM ignored it), k=N (vLLM loaded N tokens)."""
    verifier = argv[1]
    port = argv[argv.index("--port") + 1]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    k = next((d[2:] for d in drop if d.startswith("k=")), str(spec["num_speculative_tokens"]))
    conf = json.loads((Path(spec["model"]) / "config.json").read_text())
    aux = drafter_fields(conf)["aux_layer_ids"]
    out = []
    for line in REAL_LOG.read_text().splitlines():
        if line.startswith("# "):
            continue
        if "Using auxiliary layers from speculative config" in line:
            if aux is None or "aux" in drop:
                continue
            line = line.replace("(1, 3, 5)", str(tuple(aux)))
        if "spec" in drop:
            line = re.sub(r"SpeculativeConfig\(.*?\)(?=, tokenizer=)", "None", line)
            line = re.sub(r", 'speculative_config': \{.*?\}", "", line)
        out.append(line.replace(REC_TARGET, verifier).replace(REC_DRAFTER, spec["model"])
                   .replace("num_spec_tokens=3", f"num_spec_tokens={k}")
                   .replace("'num_speculative_tokens': 3", f"'num_speculative_tokens': {k}")
                   .replace(str(REC_PORT), port))
    return "\n".join(out) + "\n"


def standin_main(exe: str, argv: list[str]) -> None:
    """The stand-in `vllm serve`: its log on stdout, then /v1/models (the recorded answer, for
    this verifier) and /metrics (one drafting round more per scrape) on 127.0.0.1:--port. A
    test that serves its own figures on that port already: then only wait to be stopped.
    `exit` in the drop file: stop after the log (a server that failed to start); `mute`: no
    HTTP at all (one still loading)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests.vllm_metrics_standin import page, serving

    drop_file = Path(exe + ".drop")
    drop = set(drop_file.read_text().split()) if drop_file.is_file() else set()
    sys.stdout.write(standin_log(argv, drop))
    sys.stdout.flush()
    if "exit" in drop:
        raise SystemExit(1)
    models = json.loads(REAL_MODELS.read_text())
    for m in models["data"]:
        m["id"] = m["root"] = argv[1]
    rounds = iter(range(1, 10**6))

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path == "/v1/models":
                body, kind = json.dumps(models).encode(), "application/json"
            elif self.path == "/metrics":
                body, kind = page(serving(next(rounds))).encode(), "text/plain"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    try:
        if "mute" in drop:
            raise OSError("mute")
        ThreadingHTTPServer(("127.0.0.1", int(argv[argv.index("--port") + 1])),
                            Handler).serve_forever()
    except OSError:  # the port is taken (or told to stay silent)
        pass
    while True:
        time.sleep(3600)
