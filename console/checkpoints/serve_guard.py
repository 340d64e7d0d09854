"""What `serve` checks on the host before it starts vLLM: the words passed through to `vllm
serve`, and the port.

A swappable server (dev mode: weight-update routes that load files and run code) must stay on
the host's loopback. vLLM's parser reads a host option in more spellings than `--host ADDR`:
`--host=ADDR`, any unique prefix (`--ho ADDR`, `--hos=ADDR`) and a `--config FILE.yaml` with a
`host:` key. The spellings a user can see are refused by name, and the console's own `--host
127.0.0.1` comes last on the command line, where vLLM's parser lets nothing override it (a
config file's values are inserted before the command line's; the last `--host` wins).

The port: vLLM started on a port something already listens on fails late, or (with
SO_REUSEPORT elsewhere) runs beside the first server unseen. So the host is asked whether the
port can be bound, and who listens on it; a serving run that holds it, or is still starting on
it, is named with the command that frees it.
"""

from __future__ import annotations

from collections.abc import Sequence

from console.checkpoints.answers import PortState, served_drafter
from console.errors import ConsoleError
from console.hosts.host import Host
from console.scheduler.run_record import RunRecord
from console.scheduler.run_status import RunStatus

HOST_OPTION = "--host"
#: vLLM's shortest unambiguous prefix of --host (`--h` could also be --help, --headless, ...)
MIN_PREFIX = len("--ho")
DEFAULT_PORT = 8000

#: run on the host with its own Python (standard library): can the port be bound, and which
#: processes of this user listen on it (/proc/net/tcp{,6} inodes matched to /proc/PID/fd)
_PORT_SCRIPT = r"""
import errno, json, os, socket, sys
port = int(sys.argv[1])
out = {"free": True, "why": "", "holders": []}
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("0.0.0.0", port))
except OSError as e:
    out["free"] = False
    out["why"] = os.strerror(e.errno) if e.errno else str(e)
finally:
    s.close()
if not out["free"]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    p = line.split()
                    if len(p) > 9 and p[3] == "0A" and int(p[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add("socket:[%s]" % p[9])
        except OSError:
            pass
    for pid in os.listdir("/proc") if inodes else []:
        if not pid.isdigit():
            continue
        try:
            fds = os.listdir("/proc/%s/fd" % pid)
            if not any(os.readlink("/proc/%s/fd/%s" % (pid, fd)) in inodes for fd in fds):
                continue
            with open("/proc/%s/stat" % pid) as f:
                pgid = int(f.read().rsplit(")", 1)[1].split()[2])
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read(400).replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except (OSError, ValueError, IndexError):
            continue
        out["holders"].append({"pid": int(pid), "pgid": pgid, "cmd": cmd})
print(json.dumps(out))
"""


def host_words(extra: Sequence[str]) -> list[str]:
    """The words of `extra` that vLLM's parser reads as its --host option, with their value
    (pure): `--host ADDR`, `--host=ADDR` and unique prefixes (`--ho ADDR`, `--hos=ADDR`)."""
    out = []
    for i, w in enumerate(extra):
        if not w.startswith("--"):
            continue
        key = w.split("=", 1)[0].replace("_", "-")
        if len(key) >= MIN_PREFIX and HOST_OPTION.startswith(key):
            out.append(w if "=" in w or i + 1 == len(extra) else f"{w} {extra[i + 1]}")
    return out


def check_extra(extra: Sequence[str], swappable: bool) -> None:
    """Refuse (ConsoleError) passed-through words that would take a swappable server off the
    loopback, or hide the console's own `--host 127.0.0.1` from vLLM's parser."""
    if not swappable:
        return
    found = host_words(extra)
    if found:
        raise ConsoleError(f"{found[0]}: a swappable server stays on the loopback (its "
                           "weight-update routes load files and run code); --no-swap to serve "
                           "elsewhere")
    if "--" in extra:
        raise ConsoleError("a bare `--` among vLLM's words would make the console's --host "
                           "127.0.0.1 a positional argument; leave it out")


def argv_port(argv: Sequence[str]) -> int:
    """The port a `vllm serve` command line asks for (the last --port; vLLM's default)."""
    port = DEFAULT_PORT
    for i, w in enumerate(argv):
        value = argv[i + 1] if w == "--port" and i + 1 < len(argv) else \
            w.split("=", 1)[1] if w.startswith("--port=") else None
        if value is not None and value.isdigit():
            port = int(value)
    return port


def serving_runs(records: Sequence[RunRecord]) -> list[RunRecord]:
    """The host's running `serve` runs (their profiles are serve-<drafter>)."""
    return [r for r in records if r.status == RunStatus.RUNNING and r.profile.startswith("serve-")
            and "serve" in r.argv]


def describe_run(rec: RunRecord) -> str:
    drafter = served_drafter(rec.argv)
    return f"run {rec.id}" + (f" (serving {drafter})" if drafter else "")


async def port_state(host: Host, port: int) -> PortState:
    res = await host.transport.run([host.cfg.python, "-c", _PORT_SCRIPT, str(port)],
                                   check=False, timeout=60)
    try:
        return PortState.parse(res.stdout)
    except (ValueError, KeyError, TypeError):
        raise ConsoleError(f"{host.name}: cannot check whether port {port} is free "
                           f"({(res.stderr.strip() or 'no answer').splitlines()[-1][:200]})"
                           ) from None


async def refuse_taken_port(host: Host, port: int, records: Sequence[RunRecord]) -> None:
    """ConsoleError naming what holds `port` on the host (a serving run, still starting or
    listening, or another process), and how to free it; nothing when the port is free."""
    runs = serving_runs(records)
    where = f"{host.name}: port {port}"
    fix = "; stop it (`eagle3-console stop {id}`) or serve on another --port"
    starting = [r for r in runs if argv_port(r.argv) == port]
    # a Slurm host is its login node: the server runs on a compute node, whose ports are not
    # the login node's; only the runs' own records say anything there
    state = PortState(True, "", ()) if host.cfg.scheduler == "slurm" else \
        await port_state(host, port)
    if state.free and not starting:
        return
    by_group = {r.pid: r for r in runs if r.pid}
    for h in state.holders:
        rec = next((by_group[p] for p in (h.pgid, h.pid) if p in by_group), None)
        if rec is not None:
            raise ConsoleError(f"{where} is taken by {describe_run(rec)}" + fix.format(id=rec.id))
    if starting:
        rec = starting[0]
        raise ConsoleError(f"{where} is asked for by {describe_run(rec)}, still starting"
                           + fix.format(id=rec.id))
    if state.holders:
        h = state.holders[0]
        raise ConsoleError(f"{where} is taken by pid {h.pid} ({h.cmd or '?'}); stop it or serve "
                           "on another --port")
    raise ConsoleError(f"{where} cannot be used ({state.why or 'in use'}; not by a process of "
                       "this user); serve on another --port")
