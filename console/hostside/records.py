"""Run records and the process plumbing that runner.py and slurm_job.py share (standard
library only; runs on the host).

Records: run.json written atomically and private (write_json), read back and checked field by
field before anything acts on it (record_problem, load_record: a pid that is not a process id
never reaches kill(2)), listed with lost runs marked (list_runs, effective) and, for a Slurm
run, with what its other nodes recorded (with_nodes). Processes: a pid is ours only while its
start time is the recorded one (proc_start, ours), a group is alive while a member is not a
zombie (group_alive). Starting: the profile lock (lock_profile), the forked command's side of a
start (run_command: own session and group, waits until it is recorded, then exec) and the
reaping loop (reap_until). Forgetting: the ended runs' files we wrote (prune_runs). See
runner.py for the whole design.

Imported as a sibling: `from . import records` in a package (console.hostside in the
console), compiled from source by runner.py when that runs as a script on the host.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import signal
import stat
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:  # typing.TypeGuard is 3.10+; hosts may run 3.8, annotations stay strings
    from typing import TypeGuard

RECORD = "run.json"
SPEC = "spec.json"
STOP_MARKER = "stop"
RUNNER_LOG = "runner.log"
STATUSES = ("pending", "running", "succeeded", "failed", "stopped", "lost")
PID_MAX = 4194304            # PID_MAX_LIMIT on 64-bit Linux: no pid is larger
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD")
MASK = "***"
HAVE_PROC = os.path.isdir("/proc/self")


class RunnerError(Exception):
    """A one-line failure for the console (printed as {"error": ...})."""


# -- records -------------------------------------------------------------------------------------

def write_json(path: str, obj: Any) -> None:
    """Write obj to path atomically, private to the user (0600); no temp file is left behind."""
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(fd, 0o600)  # a stale temp file of a dead process may have other bits
            json.dump(obj, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


RECORD_MAX = 4 << 20     # a run.json is a few KB (attempts included): anything bigger is not ours
DEPTH_MAX = 32           # and nests a few levels deep (attempts -> argv): deeper is not ours


def read_bounded(path: str, limit: int = RECORD_MAX) -> bytes:
    """A small regular file's bytes. Never blocks on a FIFO (opened O_NONBLOCK, checked on the
    opened file), never reads a device or more than `limit` bytes: an OSError (ENOENT as
    FileNotFoundError) or a ValueError saying what is wrong."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    # the file object owns fd from here: a signal anywhere below closes it once, through it
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError("larger than %d bytes" % limit)
    return data


def parse_json(data: bytes) -> Any:
    """A small JSON document of ours; ValueError for bad UTF-8, bad JSON or nesting deeper
    than a record of ours ever does (measured without recursion: no stack to exhaust here)."""
    try:
        obj = json.loads(data.decode("utf-8"))
        todo = [(obj, 1)]
        while todo:
            o, depth = todo.pop()
            if isinstance(o, (dict, list)):
                if depth > DEPTH_MAX:
                    raise RecursionError
                todo.extend((v, depth + 1) for v in (o.values() if isinstance(o, dict) else o))
    except RecursionError:  # json's own too
        raise ValueError("nested deeper than %d levels" % DEPTH_MAX) from None
    return obj


def read_json(path: str, limit: int = RECORD_MAX) -> Optional[Dict[str, Any]]:
    """A JSON object from a small regular file; None for anything else (missing, unreadable,
    not a regular file, too big, too deep, not JSON, not an object)."""
    try:
        obj = parse_json(read_bounded(path, limit))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def is_secret(key: Any) -> bool:
    """Whether an env key names a secret (its value is never written to disk)."""
    name = str(key).upper()
    return any(word in name for word in SECRET_WORDS)


def masked(env: Any) -> Any:
    """env with the values of secret-looking keys replaced by ***, for the records."""
    if not isinstance(env, dict):
        return env
    return {k: (MASK if is_secret(k) else v) for k, v in env.items()}


def is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_time(v: Any) -> bool:
    # seconds since the epoch that time.localtime can show (1e400 reads as inf)
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and 0 <= v < 253402300800)


def record_problem(rec: Any, name: Optional[str] = None) -> Optional[str]:
    """Why a run record cannot be trusted (None when it can). name: its directory's name.

    Every field the console or `stop` acts on is checked by type and range: a record with a
    pid that is not a process id must never reach kill(2)."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    rid = rec.get("id")
    if not isinstance(rid, str) or not rid:
        return "id: expected a run id, got %.40r" % (rid,)
    if name is not None and rid != name:
        return "id %.40r does not match its directory %.40r" % (rid, name)
    status = rec.get("status")
    if status not in STATUSES:
        return "status: %.40r is not one of %s" % (status, ", ".join(STATUSES))
    for key in ("pid", "pgid", "monitor_pid"):
        v = rec.get(key)
        if v is None and not (status == "running" and key != "monitor_pid"):
            continue
        if not is_int(v) or not 0 < v <= PID_MAX:
            return "%s: %.40r is not a process id" % (key, v)
    for key in ("pid_start", "monitor_start", "exit_code"):
        v = rec.get(key)
        if v is not None and not is_int(v):
            return "%s: expected an integer, got %.40r" % (key, v)
    for key in ("start", "end"):
        v = rec.get(key)
        if v is not None and not _is_time(v):
            return "%s: %.40r is not a time" % (key, v)
    for key, default, low in (("node_rank", 0, 0), ("nnodes", 1, 1)):
        v = rec.get(key, default)
        if v is not None and (not is_int(v) or v < low):
            return "%s: expected an integer >= %d, got %.40r" % (key, low, v)
    for key in ("profile", "host", "cwd", "run_dir", "stdout", "stderr"):
        v = rec.get(key)
        if v is not None and not isinstance(v, str):
            return "%s: expected a string, got %.40r" % (key, v)
    job = rec.get("job_id")
    if job is not None and not (isinstance(job, str) and job.isdigit() and len(job) < 20):
        return "job_id: %.40r is not a Slurm job id" % (job,)
    for key, kind, what in (("argv", list, "a list"), ("env", dict, "an object"),
                            ("push", dict, "an object")):
        v = rec.get(key)
        if v is not None and not isinstance(v, kind):
            return "%s: expected %s, got %.40r" % (key, what, v)
    return None


def load_record(run_dir: str) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """(record, None) for a trustworthy run.json, (None, reason) otherwise; a missing one
    raises FileNotFoundError (a start still in progress, or no run at all)."""
    path = os.path.join(run_dir, RECORD)
    try:
        data = read_bounded(path)
    except FileNotFoundError:
        raise
    except OSError as e:
        return None, "cannot read %s: %s" % (RECORD, e.strerror or e)
    except ValueError as e:  # a FIFO, a device, a file far too big
        return None, "cannot read %s: %s" % (RECORD, e)
    try:
        rec = parse_json(data)
    except ValueError as e:  # also bad UTF-8, and nesting too deep
        return None, "%s is not valid JSON: %s" % (RECORD, e)
    problem = record_problem(rec, os.path.basename(os.path.normpath(run_dir)))
    if problem is not None:
        return None, problem
    return rec, None


def corrupt(run_dir: str, reason: str) -> Dict[str, Any]:
    """What `list` reports for a record it cannot trust."""
    name = os.path.basename(os.path.normpath(run_dir))
    return {"id": name, "status": "corrupt", "error": reason, "run_dir": run_dir,
            "profile": name.rsplit("-", 3)[0] if name.count("-") >= 3 else ""}


# -- processes -----------------------------------------------------------------------------------

def proc_start(pid: int) -> Optional[int]:
    """Start time of pid in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read().decode("ascii", "replace")
        return int(data[data.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def ours(pid: Any, start: Any) -> bool:
    """Whether pid is still the process a record names: it exists (a zombie counts: its pid
    cannot be reused yet) and its start time is the recorded one. A pid whose start time we
    cannot read (gone, or hidden from us) is not ours."""
    if not is_int(pid) or not 0 < pid <= PID_MAX:
        return False
    if HAVE_PROC:
        now = proc_start(pid)
        return now is not None and now == start
    try:  # no /proc (not Linux): existence is all there is to check
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def group_alive(pgid: Optional[int]) -> bool:
    """Whether the process group has a member that is not a zombie (a dead process its parent
    has not reaped yet still counts for kill(2), but it is gone for us). Only meaningful for
    a group already known to be ours (see stop)."""
    if not pgid:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return True  # no /proc: trust kill(2)
    for pid in pids:
        try:
            with open("/proc/%d/stat" % pid, "rb") as f:
                data = f.read().decode("ascii", "replace")
            fields = data[data.rindex(")") + 2:].split()
        except (OSError, ValueError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def exit_code(status: int) -> int:
    """Like subprocess: the exit status, or -N when killed by signal N."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# -- listing -------------------------------------------------------------------------------------

def is_slurm(rec: Dict[str, Any]) -> bool:
    return rec.get("scheduler") == "slurm"


def effective(rec: Dict[str, Any]) -> Dict[str, Any]:
    """The record as it stands now: a `running` one whose command and monitor are both gone
    (or whose pids now belong to other processes) is `lost`."""
    if rec.get("status") != "running" or is_slurm(rec):
        return rec  # a Slurm job's pids are on a compute node: the console asks the scheduler
    if ours(rec.get("pid"), rec.get("pid_start")) or ours(rec.get("monitor_pid"),
                                                          rec.get("monitor_start")):
        return rec
    out = dict(rec)
    out["status"] = "lost"
    return out


def with_nodes(run_dir: str, rec: Dict[str, Any]) -> Dict[str, Any]:
    """A Slurm record with what its other nodes recorded (node-R.json), as "nodes"."""
    n = rec.get("nnodes")
    if not is_int(n) or n <= 1:
        return rec
    nodes = []
    for rank in range(1, min(n, 4096)):
        other = read_json(os.path.join(run_dir, "node-%d.json" % rank))
        if other is None or record_problem(other) is not None:
            continue
        nodes.append({k: other.get(k) for k in ("node_rank", "status", "exit_code",
                                                "node_host", "start", "end")})
    return dict(rec, nodes=nodes)


BEST_RECORD_MAX = 1 << 20   # provenance.json is a few KB; anything bigger is not the engine's
#: an acceptance length counts the token the target adds: at least 1, and never more than the
#: draft's steps + 1 (a few; far under 64); a step is a training step count (far under 10**9)
TAU_MAX = 64.0
STEP_MAX = 10 ** 9


def best_figure(tau: Any, step: Any) -> Optional[Dict[str, Any]]:
    """{"tau", "step"} when tau is an acceptance length and step a training step (finite, in
    range; a bool is neither); None otherwise."""
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not is_int(step):
        return None
    if not (1.0 <= tau <= TAU_MAX) or not 0 <= step <= STEP_MAX:  # NaN fails both ways
        return None
    return {"tau": float(tau), "step": step}


def best_of(run_dir: str, rec: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The best held-out figure an `engine train` run has exported so far: its `--out`'s
    best/provenance.json (the engine rewrites it at each checkpoint that improves), as
    {"tau": held-out acceptance length, "step": its step}; None for anything else (a file
    that is not a small regular file of JSON, a figure out of range)."""
    argv = rec.get("argv")
    if not isinstance(argv, list) or "train" not in argv or "engine" not in argv:
        return None
    out = None
    for i, word in enumerate(argv):
        if word == "--out" and i + 1 < len(argv):
            out = argv[i + 1]
        elif isinstance(word, str) and word.startswith("--out="):
            out = word[len("--out="):]
    if not isinstance(out, str) or not out:
        return None
    cwd = os.path.expanduser(rec.get("cwd") or "~")   # where the runner started the command
    prov = read_json(os.path.join(cwd, os.path.expanduser(out), "best", "provenance.json"),
                     BEST_RECORD_MAX)
    if prov is None:
        return None
    return best_figure(prov.get("held_out_tau"), prov.get("step"))


def list_runs(runs_dir: str, run_id: Optional[str] = None) -> List[Dict[str, Any]]:
    """Every run's record as it stands now (a training run's best held-out figure added as
    "best"); one that cannot be trusted as `corrupt` (with the reason in "error"), so one bad
    file never hides the others."""
    try:
        names = [run_id] if run_id else sorted(os.listdir(runs_dir))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        run_dir = os.path.join(runs_dir, name)
        if name.startswith(".") or not os.path.isdir(run_dir):
            continue
        try:
            entry = _listed(run_dir)
        except FileNotFoundError:
            continue  # no record yet: a start in progress (or one that never happened)
        except Exception as e:  # noqa: BLE001  one run's files never take the list down
            entry = corrupt(run_dir, "cannot be listed: %s: %s" % (type(e).__name__, e))
        out.append(entry)
    return out


def _listed(run_dir: str) -> Dict[str, Any]:
    """One run as `list` reports it (FileNotFoundError when it has no record)."""
    rec, problem = load_record(run_dir)
    if rec is None:
        return corrupt(run_dir, problem or "?")
    if is_slurm(rec):
        rec = with_nodes(run_dir, rec)
    best = best_of(run_dir, rec)
    if best is not None:
        rec = dict(rec, best=best)
    return effective(rec)


# -- forgetting ended runs ----------------------------------------------------------------------

ENDED = ("succeeded", "failed", "stopped", "lost")
#: the files the runner, the monitor and a Slurm job write in a run directory (temp names of
#: our atomic writes included); anything else there (an engine's out/) is not ours to delete
OWN_FILES = (RECORD, SPEC, RUNNER_LOG, STOP_MARKER, "output.log", "events.jsonl", "job.sh",
             ".record.lock", "stop-hold.json")
OWN_PATTERNS = (re.compile(r"node-\d+\.json"), re.compile(r"output\.node-\d+\.log"),
                re.compile(r"events\.node-\d+\.jsonl"),
                re.compile(r"(run|node-\d+)\.json\.tmp-\d+"))


def is_own_file(name: str) -> bool:
    return name in OWN_FILES or any(p.fullmatch(name) for p in OWN_PATTERNS)


def _still_active(rec: Dict[str, Any]) -> Optional[str]:
    """Why a trusted record must be kept (None when its run has ended everywhere)."""
    status = rec.get("status")
    if status not in ENDED:
        return str(status)
    for node in rec.get("nodes") or []:  # a Slurm run: another node may still be running
        if isinstance(node, dict) and node.get("status") not in ENDED:
            return "node %s %s" % (node.get("node_rank"), node.get("status"))
    return None


def prune_runs(runs_dir: str) -> Dict[str, Any]:
    """Forget the runs that have ended: delete the files we wrote in their directories (the
    record last, so an interrupted prune leaves a run still listed) and the directory once it
    is empty. Never signals anything; keeps running and queued runs, records it cannot trust,
    and every file it did not write. {"removed": [id], "kept": [{"id", "why"}],
    "left": [{"id", "files"}]} (left: directories kept for files that are not ours). Each run
    is judged under its profile's launch lock, which `start --resume` holds until its new
    attempt is recorded: a run resumed meanwhile is seen running, never deleted under it."""
    out: Dict[str, Any] = {"removed": [], "kept": [], "left": []}
    try:
        names = sorted(os.listdir(runs_dir))
    except FileNotFoundError:
        return out
    root = os.path.dirname(os.path.normpath(runs_dir))
    for name in names:
        run_dir = os.path.join(runs_dir, name)
        if name.startswith(".") or os.path.islink(run_dir) or not os.path.isdir(run_dir):
            continue
        try:
            rec, problem = load_record(run_dir)
        except FileNotFoundError:
            continue  # no record: a start in progress, or not a run of ours
        if rec is None:
            out["kept"].append({"id": name, "why": "corrupt record (%s)" % problem})
            continue
        lock = lock_profile(root, str(rec.get("profile") or ""))
        try:
            _prune_one(run_dir, name, out)
        finally:
            os.close(lock)
    return out


def _prune_one(run_dir: str, name: str, out: Dict[str, Any]) -> None:
    """Judge run_dir's record afresh (under its profile's lock) and forget the run if it ended."""
    try:
        rec, problem = load_record(run_dir)
    except FileNotFoundError:  # another prune forgot it meanwhile
        return
    if rec is None:
        out["kept"].append({"id": name, "why": "corrupt record (%s)" % problem})
        return
    why = _still_active(effective(with_nodes(run_dir, rec) if is_slurm(rec) else rec))
    if why is not None:
        out["kept"].append({"id": name, "why": why})
        return
    others = _remove_own_files(run_dir)
    out["removed"].append(name)
    if others:
        out["left"].append({"id": name, "files": others})


def _remove_own_files(run_dir: str) -> List[str]:
    """Unlink our files in run_dir (run.json last) and rmdir it; the names left there."""
    names = sorted(os.listdir(run_dir), key=lambda n: n == RECORD)
    others = []
    for name in names:
        path = os.path.join(run_dir, name)
        if not is_own_file(name) or (os.path.isdir(path) and not os.path.islink(path)):
            others.append(name)
            continue
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    if not others:
        try:
            os.rmdir(run_dir)
        except OSError:  # something appeared meanwhile: it stays, with the directory
            others = sorted(os.listdir(run_dir))
    return others


# -- starting a command (both runner.start and slurm_job.node) ----------------------------------

def answer(what: str, run_dir: str, work: Callable[[], Dict[str, Any]]) -> int:
    """Print work()'s report (an OSError becomes its {"error": ...}); 1 when it is an error."""
    try:
        report = work()
    except OSError as e:
        report = {"error": "cannot %s a run in %s: %s" % (what, run_dir, e.strerror or e)}
    print(json.dumps(report))
    return 1 if "error" in report else 0


def lock_profile(root: str, profile: str) -> int:
    """An exclusive flock on ROOT/.launch-PROFILE.lock (blocks while another start holds it)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in profile) or "_"
    fd = os.open(os.path.join(root, ".launch-%s.lock" % safe),
                 os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_unrecorded(run_dir: str) -> None:
    """A run that never got its record leaves nothing: remove the files we wrote there (and
    the directory, when nothing else is in it)."""
    if os.path.exists(os.path.join(run_dir, RECORD)):
        return  # recorded (e.g. as failed): the registry keeps it
    try:
        names = os.listdir(run_dir)
    except OSError:
        return
    for name in names:
        if name in (SPEC, RUNNER_LOG) or name.startswith(RECORD + ".tmp-"):
            try:
                os.unlink(os.path.join(run_dir, name))
            except OSError:
                pass
    try:
        os.rmdir(run_dir)
    except OSError:
        pass


def run_command(spec: Dict[str, Any], out_path: str, err_path: str, go_r: int,
             exec_w: int) -> None:
    """In the forked command process: own session and group, wait until the monitor has
    recorded us, redirect, exec. Never returns."""
    try:
        os.setsid()
        for sig in (signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        if os.read(go_r, 1) != b"g":
            os._exit(126)  # the monitor died before recording the run: never start it
        os.close(go_r)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        out = os.open(out_path, flags, 0o600)
        err = out if err_path == out_path else os.open(err_path, flags, 0o600)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
        for key, value in (spec.get("path_prepend") or {}).items():
            env[key] = value + (os.pathsep + env[key] if env.get(key) else "")
        cwd = os.path.expanduser(spec.get("cwd") or "~")
        try:
            os.chdir(cwd)
        except OSError as e:
            raise OSError("cannot enter working directory %s: %s" % (cwd, e.strerror)) from e
        argv = [str(a) for a in spec["argv"]]
        try:
            os.execvpe(argv[0], argv, env)
        except OSError as e:
            raise OSError("cannot run %s: %s" % (argv[0], e.strerror)) from e
    except BaseException as e:  # noqa: BLE001
        try:
            os.write(exec_w, str(e).encode())
        except OSError:
            pass
        os._exit(127)


def reap_until(pid: int) -> int:
    """Reap every child (the command and adopted orphans) until the command ends; its status."""
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:  # cannot happen before pid is reaped; be safe anyway
            _, status = os.waitpid(pid, os.WNOHANG)
            return status
        if done == pid:
            return status
