"""`eagle3-console bench HOST [--prompts FILE | --data DIR] [-n N] [--max-tokens M]
[--fixed-length] [--concurrency C] [--url URL] [--json]`: replay the same prompts
(chat-templated by the target's tokenizer in vLLM, greedy, each reply to EOS or M tokens, as
served traffic stops; --fixed-length: M tokens each, past EOS) against the vLLM server `serve`
started on HOST, through HOST's own connection, and report the acceptance length and
per-position acceptance from the /metrics deltas of exactly that replay (and per request,
where vLLM runs with --per-request-spec-decode-metrics), throughput and latency, under the
drafter the server says it runs. Each replay is a row in `compare` (its server and weight
version)."""

from __future__ import annotations

import argparse
import json
import sys

from console.checkpoints.bench import replay
from console.checkpoints.prompts import read_prompts_dir, read_prompts_file
from console.errors import ConsoleError
from console.hosts.host import HostPool
from console.settings.config import Config

HELP = "replay prompts against the vLLM server on HOST and measure that replay's acceptance"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("host", help="a configured host name (the server runs there)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", metavar="FILE",
                     help="JSON lines here: messages, conversations, prompt or a string each")
    src.add_argument("--data", metavar="DIR",
                     help="a folder of conversation files (*.jsonl) on HOST")
    p.add_argument("-n", type=int, default=None, metavar="N", help="the first N prompts only")
    p.add_argument("--max-tokens", type=int, default=64, metavar="M",
                   help="at most M tokens per reply (default 64); replies stop at EOS")
    p.add_argument("--fixed-length", action="store_true",
                   help="generate exactly M tokens per reply, past EOS (vLLM's ignore_eos): "
                        "text no conversation holds, so acceptance is lower than served "
                        "traffic's")
    p.add_argument("--concurrency", type=int, default=1, metavar="C",
                   help="requests at once (default 1)")
    p.add_argument("--url", help="the server's base URL as seen from the host (default: the "
                                 "newest `serve` on HOST)")
    p.add_argument("--json", action="store_true", help="print the replay as JSON")


async def run(args: argparse.Namespace, config: Config, pool: HostPool) -> int:
    if args.n is not None and args.n < 1:
        raise ConsoleError("-n must be at least 1")
    host = await pool.ensure(args.host)
    await host.connect()
    prompts = read_prompts_file(args.prompts, args.n) if args.prompts else \
        await read_prompts_dir(host, args.data, args.n)
    res = await replay(host, prompts, url=args.url, max_tokens=args.max_tokens,
                       concurrency=args.concurrency, fixed_length=args.fixed_length)
    if args.json:
        print(json.dumps(res.to_json(), indent=2))
        return 0
    r = res.run
    t = r.total
    al = t.acceptance_length if t else None
    length = f"x {r.max_tokens} tokens (fixed length, past EOS)" if r.stop == "fixed" \
        else f"to EOS (at most {r.max_tokens} tokens; {r.completion_tokens} generated)"
    version = f" ({r.weight_version})" \
        if r.weight_version and r.weight_version != r.drafter else ""
    print(f"{args.host}: {r.prompts} prompts {length}, concurrency {r.concurrency}, "
          f"{r.drafter}{version}")
    print(f"  acceptance length {al:.3f}" if al is not None else "  no drafts measured")
    print(f"  per position {[round(x, 3) for x in t.per_position] if t else []}")
    print(f"  {r.generation_tokens_per_s or 0:.1f} tok/s, latency median "
          f"{r.latency_median or 0:.2f} s, max {r.latency_max or 0:.2f} s")
    rt = r.requests_total
    if rt and rt.acceptance_length is not None and res.per_request is not None:
        print(f"  per request (vLLM's --per-request-spec-decode-metrics): acceptance length "
              f"{rt.acceptance_length:.3f} over {len(res.per_request)} requests")
    if r.records_disagree:
        print(f"warning: {r.records_disagree}", file=sys.stderr)
    if r.other_traffic:
        print("warning: the server served other requests during the replay: its counters "
              "include them", file=sys.stderr)
    return 0
