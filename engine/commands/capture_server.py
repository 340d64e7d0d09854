"""`python -m engine capture-server`: start (or print) the vLLM server that captures features."""

from __future__ import annotations

import argparse

from engine.capture.server import DEFAULT_STORAGE  # standard library only, like this module
from engine.events import Emitter

HELP = "start vLLM with hidden-state extraction for TARGET (prepare/train --from-vllm read it)"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="target model directory")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: the client must share the files)")
    p.add_argument("--storage", default=DEFAULT_STORAGE,
                   help="where the server writes one safetensors file per request (the clients "
                   "read and delete files there only: pass the same --server-storage to "
                   f"prepare/train --from-vllm unless it is the default, {DEFAULT_STORAGE})")
    p.add_argument("--served-model-name", help="model name the server answers to")
    p.add_argument("--dtype", help="the dtype vLLM serves the target in (default: config.json's; "
                   "vLLM's own default serves a float32 target in 16 bits, and the features "
                   "would be rounded there but stored as the target's own)")
    p.add_argument("--vllm", default="vllm", help="the vllm executable (default: vllm on PATH)")
    p.add_argument("--extra", default="", help="more `vllm serve` arguments, one shell string")
    p.add_argument("--print", action="store_true", help="print the command line, do not start it")
    p.add_argument("--json", action="store_true", help="with --print: the command as JSON")


def run(args: argparse.Namespace, ev: Emitter) -> int:
    import os
    import shlex
    import shutil

    from engine.capture.server import (
        default_layer_ids,
        refuse_mla,
        serve_argv,
        target_config,
    )
    from engine.ckpt.target_config import config_dtype
    from engine.ckpt.target_layout import vllm_text_only
    from engine.errors import EngineError
    if args.tp < 1:
        raise EngineError(f"--tp {args.tp}: must be >= 1")
    cfg = target_config(args.target)
    refuse_mla(cfg, args.target)
    ids = default_layer_ids(int(cfg["num_hidden_layers"]))
    argv = serve_argv(args.target, ids, tp=args.tp, port=args.port, host=args.host,
                      storage=args.storage, vllm=args.vllm, served_name=args.served_model_name,
                      dtype=args.dtype or config_dtype(cfg), extra=shlex.split(args.extra))
    line = shlex.join(argv)
    text_only = vllm_text_only(args.target, shlex.split(args.extra))[1]
    if text_only:  # serve_argv added --language-model-only
        ev.log(text_only)
    if args.print:
        ev.answer({"argv": argv, "command": line, "layer_ids": ids,
                   "storage": os.path.abspath(args.storage)}, args.json, lambda r: r["command"])
        return 0
    exe = shutil.which(args.vllm)
    if exe is None:
        raise EngineError(f"--vllm {args.vllm}: not found on PATH (pip install vllm, or pass "
                          "the executable's path)")
    os.makedirs(args.storage, exist_ok=True)
    ev.log(f"starting: {line}")
    ev.close()  # flush our events: exec replaces this process
    if args.events:  # stdout is the event stream: vLLM's own output goes to stderr (the run log)
        os.dup2(2, 1)
    os.execv(exe, argv)
    return 0  # not reached
