"""Detached runs on the host: start, list, stop (standard library only; runs on the host).

    python -B runner.py start RUN_DIR [--unless-running] < spec.json   prints {"pid", ...}
    python -B runner.py list RUNS_DIR [RUN_ID]                         prints [record, ...]
    python -B runner.py stop RUN_DIR GRACE_S                           prints the final record
    python -B runner.py freeport                                       prints a free TCP port
    python -B runner.py submit RUN_DIR [--unless-running] < spec.json  sbatch; prints {"job_id"}
    python -B runner.py node RUN_DIR           (under srun, on every node of a Slurm job)
    python -B runner.py settle RUN_DIR < {"status", "reason", "slurm_state"}  prints the record
    python -B runner.py mark-stop RUN_DIR      (a stop was asked for: the exit reads `stopped`)

(run as a script, not `-m`: a script is compiled from source, so a bytecode cache that a full
disk left truncated cannot break it; errors print {"error": ...} and exit 1)

`start` double-forks: the launcher forks a child that calls setsid() and forks the monitor, then
exits, so the monitor belongs to no SSH session and survives the connection. The monitor forks
the command, which calls setsid() again: the command leads its own session and process group
(what `stop` signals), apart from the monitor. The command waits until the monitor has written
run.json (atomically: temp name, then rename) with its pid, group and start time; a run that
cannot be recorded (a full disk) is killed before it runs anything. The monitor then waits for
the command and records its exit code and end time, whether or not any console is connected.
Nothing but the monitor writes a record while it lives; `list` reports `lost` for a record
still `running` whose command and monitor are both gone (a reboot, a killed monitor), and
`corrupt` (with the reason) for a record it cannot trust; `stop` finishes the record itself
only when the monitor is gone.

Safety: a pid is ours only while its start time (/proc/PID/stat) is the one recorded, so a pid
or process group reused by another process is never signalled. Run directories are 0700 and
every file in them 0600; env values whose names look secret are written as `***` (the command
gets the real ones). Starts of one profile are serialised by a lock file in ROOT, held from the
"already running" check until the new run is recorded.

Slurm (a record with "scheduler": "slurm"): `submit` (on the login node, under the same profile
lock) writes the batch script job.sh and a `pending` run.json, then runs `sbatch --parsable`
(the profile's env, secrets included, reaches the job through sbatch's environment, never our
files) and records the job id. The script runs `srun ... runner.py node RUN_DIR`: one `node` per
allocated node, in the foreground (srun tracks it), starts the command like the monitor does
(own session and group, recorded before it runs) with SLURM_NODEID as the node rank and the
first node of the allocation as the rendezvous, forwards SIGTERM (scancel --signal, time
limit) to the command's group and records the exit: node 0 in run.json, node R in
node-R.json, its output in output.node-R.log. The pids of a Slurm record are on a compute
node: `list` never judges them (the console asks squeue/sacct and `settle`s the record), and
`stop` refuses them (the console uses scancel). run.json is read-modified-written under the
lock file .record.lock in the run directory (the login node and node 0 both write it).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:  # typing.TypeGuard is 3.10+; hosts may run 3.8, annotations stay strings
    from typing import TypeGuard

RECORD = "run.json"
SPEC = "spec.json"
STOP_MARKER = "stop"
RUNNER_LOG = "runner.log"
STATUSES = ("pending", "running", "succeeded", "failed", "stopped", "lost")
JOB_SCRIPT = "job.sh"
RECORD_LOCK = ".record.lock"
SBATCH_TIMEOUT = 120
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


def read_json(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
        return obj if isinstance(obj, dict) else None
    except (OSError, ValueError):
        return None


def is_secret(key: Any) -> bool:
    """Whether an env key names a secret (its value is never written to disk)."""
    name = str(key).upper()
    return any(word in name for word in SECRET_WORDS)


def masked(env: Any) -> Any:
    """env with the values of secret-looking keys replaced by ***, for the records."""
    if not isinstance(env, dict):
        return env
    return {k: (MASK if is_secret(k) else v) for k, v in env.items()}


def _is_int(v: Any) -> TypeGuard[int]:
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
        if not _is_int(v) or not 0 < v <= PID_MAX:
            return "%s: %.40r is not a process id" % (key, v)
    for key in ("pid_start", "monitor_start", "exit_code"):
        v = rec.get(key)
        if v is not None and not _is_int(v):
            return "%s: expected an integer, got %.40r" % (key, v)
    for key in ("start", "end"):
        v = rec.get(key)
        if v is not None and not _is_time(v):
            return "%s: %.40r is not a time" % (key, v)
    for key, default, low in (("node_rank", 0, 0), ("nnodes", 1, 1)):
        v = rec.get(key, default)
        if v is not None and (not _is_int(v) or v < low):
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
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise
    except OSError as e:
        return None, "cannot read %s: %s" % (RECORD, e.strerror or e)
    try:
        rec = json.loads(data.decode("utf-8"))
    except ValueError as e:  # also bad UTF-8
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
    if not _is_int(pid) or not 0 < pid <= PID_MAX:
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


# -- start ---------------------------------------------------------------------------------------

def start(run_dir: str, spec: Dict[str, Any], unless_running: bool = False) -> int:
    """Start spec["argv"] detached (see the module docstring). Prints the record's pid part,
    or {"error": ...} with exit status 1 when the run did not start."""
    return _answer("start", run_dir, lambda: _start(run_dir, spec, unless_running))


def _answer(what: str, run_dir: str, work: Callable[[], Dict[str, Any]]) -> int:
    """Print work()'s report (an OSError becomes its {"error": ...}); 1 when it is an error."""
    try:
        report = work()
    except OSError as e:
        report = {"error": "cannot %s a run in %s: %s" % (what, run_dir, e.strerror or e)}
    print(json.dumps(report))
    return 1 if "error" in report else 0


def _start(run_dir: str, spec: Dict[str, Any], unless_running: bool) -> Dict[str, Any]:
    run_dir = os.path.normpath(run_dir)
    runs_dir = os.path.dirname(run_dir)
    if not os.path.isdir(runs_dir):
        os.makedirs(runs_dir, 0o700)
    profile = str(spec.get("profile") or "")
    lock = _lock_profile(os.path.dirname(runs_dir), profile)
    try:  # held until the new run is recorded (or refused): one start per profile at a time
        if unless_running:
            busy = [r["id"] for r in list_runs(runs_dir)
                    if r.get("profile") == profile and r.get("status") == "running"]
            if busy:
                return {"error": "profile %r is already running (%s); stop it or launch with "
                                 "--force" % (profile, ", ".join(busy))}
        os.mkdir(run_dir, 0o700)  # a run id is never reused
        os.chmod(run_dir, 0o700)  # whatever the umask: records may name private paths
        try:
            write_json(os.path.join(run_dir, SPEC), dict(spec, env=masked(spec.get("env"))))
            report = _fork_monitor(run_dir, spec, lock)
        except BaseException:
            _remove_unrecorded(run_dir)
            raise
        if "error" in report:
            _remove_unrecorded(run_dir)
        return report
    finally:
        os.close(lock)


def _lock_profile(root: str, profile: str) -> int:
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


def _remove_unrecorded(run_dir: str) -> None:
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


def _fork_monitor(run_dir: str, spec: Dict[str, Any], lock: int) -> Dict[str, Any]:
    report_r, report_w = os.pipe()
    child = os.fork()
    if child == 0:  # first child: leave the SSH session, fork the monitor, vanish
        try:
            os.close(lock)  # the lock is the launcher's: no process of the run may keep it
            os.close(report_r)
            os.setsid()
            if os.fork() == 0:
                _monitor(run_dir, spec, report_w)
            os._exit(0)
        except BaseException:
            os._exit(1)
    os.close(report_w)
    os.waitpid(child, 0)
    with os.fdopen(report_r, "rb") as f:
        data = f.read()
    try:
        report = json.loads(data.decode("utf-8", "replace"))
    except ValueError:
        report = None
    if not isinstance(report, dict):
        report = {"error": "the run monitor died before reporting"}
    return report


def _monitor(run_dir: str, spec: Dict[str, Any], report_w: int) -> None:
    """The monitor: start the command, report, record its end. Never returns."""
    code = 1
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        devnull = os.open(os.devnull, os.O_RDWR)
        log = os.open(os.path.join(run_dir, RUNNER_LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                      0o600)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(log, 2)  # our own tracebacks, if any
        os.chdir("/")
        _become_subreaper()
        code = _supervise(run_dir, spec, report_w)
    except BaseException as e:  # noqa: BLE001 - report anything, the launcher is waiting
        try:
            os.write(report_w, json.dumps({"error": "monitor: %s" % e}).encode())
        except OSError:
            pass
    os._exit(code)


def _supervise(run_dir: str, spec: Dict[str, Any], report_w: int) -> int:
    out_path = os.path.join(run_dir, spec.get("stdout") or "output.log")
    err_path = os.path.join(run_dir, spec.get("stderr") or "output.log")
    go_r, go_w = os.pipe()      # the command waits on it until its record is on disk
    exec_r, exec_w = os.pipe()  # closed by a successful exec (O_CLOEXEC), else carries the error
    os.set_inheritable(exec_w, False)
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        os.close(exec_r)
        os.close(report_w)
        _command(spec, out_path, err_path, go_r, exec_w)
    os.close(go_r)
    os.close(exec_w)
    rec: Dict[str, Any] = {k: v for k, v in spec.items() if k not in ("stdout", "stderr")}
    rec.update({
        "env": masked(spec.get("env")),
        "pid": pid, "pgid": pid, "pid_start": proc_start(pid),
        "monitor_pid": os.getpid(), "monitor_start": proc_start(os.getpid()),
        "start": time.time(), "status": "running", "exit_code": None, "end": None,
        "stdout": os.path.basename(out_path), "stderr": os.path.basename(err_path),
    })
    record = os.path.join(run_dir, RECORD)
    try:
        write_json(record, rec)
    except OSError as e:
        # unrecorded, the command would run unknown to `runs` and `stop`: it dies before exec
        # (it is our unreaped child, blocked on go_r: its pid is certainly still ours)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.write(report_w, json.dumps({"error": "cannot record the run in %s: %s; the command "
                                                "was not started" % (run_dir, e.strerror or e)
                                       }).encode())
        os.close(report_w)
        return 0
    os.write(go_w, b"g")
    os.close(go_w)
    with os.fdopen(exec_r, "rb") as f:
        exec_error = f.read().decode("utf-8", "replace")
    if exec_error:
        _, status = os.waitpid(pid, 0)
        rec.update({"status": "failed", "exit_code": exit_code(status), "end": time.time(),
                    "error": exec_error})
        write_json(record, rec)
        os.write(report_w, json.dumps({"error": exec_error}).encode())
        os.close(report_w)
        return 0
    os.write(report_w, json.dumps({"pid": pid, "pgid": pid, "start": rec["start"]}).encode())
    os.close(report_w)
    status = _reap_until(pid)
    rec["exit_code"] = exit_code(status)
    rec["end"] = time.time()
    if os.path.exists(os.path.join(run_dir, STOP_MARKER)):
        rec["status"] = "stopped"
    else:
        rec["status"] = "succeeded" if rec["exit_code"] == 0 else "failed"
    write_json(record, rec)
    _reap_stragglers(pid)
    return 0


def _become_subreaper() -> None:
    """Orphans of the command's tree are re-parented to us (Linux), so we reap them at once:
    a dead process then leaves its group at once and `stop` sees the group empty."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _reap_until(pid: int) -> int:
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


def _reap_stragglers(pgid: int, linger: float = 10.0) -> None:
    """After the command: reap what is left of its group as it dies (we are its subreaper),
    for up to `linger` seconds, so no zombie outlives the run for long."""
    deadline = time.time() + linger
    while time.time() < deadline:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        if not group_alive(pgid):
            return
        time.sleep(0.05)


def _command(spec: Dict[str, Any], out_path: str, err_path: str, go_r: int,
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


# -- list / stop ---------------------------------------------------------------------------------

def list_runs(runs_dir: str, run_id: Optional[str] = None) -> List[Dict[str, Any]]:
    """Every run's record as it stands now; one that cannot be trusted as `corrupt` (with
    the reason in "error"), so one bad file never hides the others."""
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
            rec, problem = load_record(run_dir)
        except FileNotFoundError:
            continue  # no record yet: a start in progress (or one that never happened)
        if rec is not None and is_slurm(rec):
            rec = _with_nodes(run_dir, rec)
        out.append(effective(rec) if rec is not None else corrupt(run_dir, problem or "?"))
    return out


def _reread(run_dir: str, rec: Dict[str, Any]) -> Dict[str, Any]:
    try:
        new, _ = load_record(run_dir)
    except FileNotFoundError:
        new = None
    return new if new is not None else rec


def stop(run_dir: str, grace: float) -> Dict[str, Any]:
    """SIGTERM the run's process group, SIGKILL what is left after grace seconds.

    Only a group whose leader is still our command (pid and start time as recorded) is
    signalled: a run whose command and monitor are gone comes back `lost` with "refused"
    saying why, and nothing is signalled or written."""
    try:
        rec, problem = load_record(run_dir)
    except FileNotFoundError:
        raise RunnerError("no run record at %s" % os.path.join(run_dir, RECORD)) from None
    if rec is None:
        raise RunnerError("the record of run %s is corrupt (%s); nothing was signalled"
                          % (os.path.basename(os.path.normpath(run_dir)), problem))
    if is_slurm(rec):
        raise RunnerError("run %s is Slurm job %s: it is stopped with scancel, not signalled "
                          "from the login node" % (rec["id"], rec.get("job_id")))
    if rec["status"] != "running":
        return effective(rec)
    pgid = rec["pgid"]
    # the command leads its own group (pgid == pid); while that process lives with the
    # recorded start time, its group id cannot belong to anyone else
    leader = pgid == rec["pid"] and ours(rec["pid"], rec.get("pid_start"))
    monitor = ours(rec.get("monitor_pid"), rec.get("monitor_start"))
    if not leader and not monitor:
        out = dict(rec, status="lost")
        out["refused"] = ("its command (pid %s) and monitor (pid %s) are gone, or their pids "
                          "now belong to other processes: not signalled"
                          % (rec["pid"], rec.get("monitor_pid")))
        return out
    if not leader:
        # the command has ended and the monitor is recording it: nothing to signal
        deadline = time.time() + 5
        while time.time() < deadline and rec.get("status") == "running":
            time.sleep(0.05)
            rec = _reread(run_dir, rec)
        return effective(rec)
    fd = os.open(os.path.join(run_dir, STOP_MARKER), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("%f\n" % time.time())
    _signal_group(pgid, signal.SIGTERM)
    # from here on the group is the one we verified: its id stays taken while it has members
    deadline = time.time() + grace
    while group_alive(pgid) and time.time() < deadline:
        time.sleep(0.05)
    if group_alive(pgid):
        _signal_group(pgid, signal.SIGKILL)
        deadline = time.time() + 5
        while group_alive(pgid) and time.time() < deadline:
            time.sleep(0.05)
    # the monitor records the end; if it is gone, finish the record ourselves
    deadline = time.time() + 5
    while time.time() < deadline:
        rec = _reread(run_dir, rec)
        if rec.get("status") != "running":
            return rec
        if not ours(rec.get("monitor_pid"), rec.get("monitor_start")):
            break
        time.sleep(0.05)
    rec = _reread(run_dir, rec)
    if rec.get("status") == "running":
        rec.update({"status": "stopped", "end": time.time()})
        write_json(os.path.join(run_dir, RECORD), rec)
    return rec


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# -- Slurm ---------------------------------------------------------------------------------------

class _RecordLock(object):
    """flock on RUN_DIR/.record.lock around a read-modify-write of run.json."""

    def __init__(self, run_dir: str) -> None:
        self.path = os.path.join(run_dir, RECORD_LOCK)
        self.fd = -1

    def __enter__(self) -> "_RecordLock":
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: Any) -> None:
        os.close(self.fd)


def _update_record(run_dir: str, changes: Dict[str, Any],
                   base: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """run.json (or base, when it cannot be read) with changes on top, written atomically."""
    path = os.path.join(run_dir, RECORD)
    with _RecordLock(run_dir):
        rec = read_json(path) or dict(base or {})
        rec.update(changes)
        write_json(path, rec)
    return rec


def submit(run_dir: str, spec: Dict[str, Any], unless_running: bool = False) -> int:
    """sbatch the batch script in spec["script"] (see the module docstring); prints
    {"job_id": ...}, or {"error": ...} with exit status 1 and nothing left behind."""
    return _answer("submit", run_dir,
                   lambda: _submit(os.path.normpath(run_dir), spec, unless_running))


def _submit(run_dir: str, spec: Dict[str, Any], unless_running: bool) -> Dict[str, Any]:
    runs_dir = os.path.dirname(run_dir)
    if not os.path.isdir(runs_dir):
        os.makedirs(runs_dir, 0o700)
    profile = str(spec.get("profile") or "")
    lock = _lock_profile(os.path.dirname(runs_dir), profile)
    try:
        if unless_running:
            busy = [r["id"] for r in list_runs(runs_dir) if r.get("profile") == profile
                    and r.get("status") in ("running", "pending")]
            if busy:
                return {"error": "profile %r is already running or queued (%s); stop it or "
                                 "launch with --force" % (profile, ", ".join(busy))}
        os.mkdir(run_dir, 0o700)
        os.chmod(run_dir, 0o700)
        try:
            report = _sbatch(run_dir, spec)
        except BaseException:
            _remove_submitted(run_dir)
            raise
        if "error" in report:
            _remove_submitted(run_dir)
        return report
    finally:
        os.close(lock)


def _sbatch(run_dir: str, spec: Dict[str, Any]) -> Dict[str, Any]:
    rec = {k: v for k, v in spec.items() if k not in ("script", "sbatch", "slurm_env")}
    rec["env"] = masked(spec.get("env"))
    write_json(os.path.join(run_dir, SPEC), rec)
    job_path = os.path.join(run_dir, JOB_SCRIPT)
    fd = os.open(job_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(str(spec.get("script") or ""))
    rec.update({"status": "pending", "job_id": None, "submitted": time.time(), "start": None,
                "end": None, "exit_code": None})
    write_json(os.path.join(run_dir, RECORD), rec)
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
    env.update({str(k): str(v) for k, v in (spec.get("slurm_env") or {}).items()})
    argv = ["sbatch"] + [str(a) for a in spec.get("sbatch") or []] + [job_path]
    try:
        proc = subprocess.Popen(argv, cwd=run_dir, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as e:
        if e.errno == 2:
            return {"error": "sbatch is not on PATH on this host (PATH=%s)"
                             % env.get("PATH", "")}
        return {"error": "cannot run sbatch: %s" % (e.strerror or e)}
    try:
        out, err = proc.communicate(timeout=SBATCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"error": "sbatch did not answer within %d s" % SBATCH_TIMEOUT}
    text = err.decode("utf-8", "replace").strip()
    if proc.returncode != 0:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return {"error": "sbatch rejected the job: %s" % ("; ".join(lines[-3:]) or
                                                          "exit status %d" % proc.returncode)}
    job_id = out.decode("utf-8", "replace").strip().split(";")[0]
    if not job_id.isdigit():
        return {"error": "sbatch --parsable printed %.80r, not a job id" % job_id}
    _update_record(run_dir, {"job_id": job_id}, rec)
    return {"job_id": job_id, "status": "pending"}


def _remove_submitted(run_dir: str) -> None:
    """A submission that failed leaves nothing: the files we wrote, then the directory."""
    for name in (SPEC, JOB_SCRIPT, RECORD, RECORD_LOCK):
        try:
            os.unlink(os.path.join(run_dir, name))
        except OSError:
            pass
    _remove_unrecorded(run_dir)


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, ""))
    except ValueError:
        return default


def _first_node() -> str:
    """The first host name of the allocation (scontrol expands SLURM_JOB_NODELIST)."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    try:
        out = subprocess.check_output(["scontrol", "show", "hostnames", nodelist])
        names = out.decode("utf-8", "replace").split()
    except (OSError, subprocess.CalledProcessError):
        names = []
    return names[0] if names else socket.gethostname()


def node(run_dir: str) -> int:
    """One node of a Slurm job (under srun): run the command in the foreground, record it.
    Exits with the command's status, so srun (--kill-on-bad-exit) and the job's state see it."""
    run_dir = os.path.normpath(run_dir)
    spec = read_json(os.path.join(run_dir, SPEC))
    if spec is None or not isinstance(spec.get("argv"), list):
        sys.stderr.write("runner node: no readable %s in %s\n" % (SPEC, run_dir))
        return 2
    rank = _env_int("SLURM_NODEID", 0)
    nnodes = _env_int("SLURM_NNODES", 1)
    job_id = os.environ.get("SLURM_JOB_ID") or None
    port = spec.get("rdzv_port") or 20000 + _env_int("SLURM_JOB_ID", 0) % 20000
    # srun was started by the batch script, which runs on the allocation's first node
    addr = (spec.get("rdzv_host") or os.environ.get("SLURM_LAUNCH_NODE_IPADDR")
            or _first_node())
    endpoint = "%s:%s" % (addr, port)
    words = {"{node_rank}": str(rank), "{rdzv_endpoint}": endpoint}
    argv = [words.get(a, a) for a in spec["argv"]]
    if rank == 0:
        out_name = spec.get("stdout") or "output.log"
        err_name = spec.get("stderr") or "output.log"
        record = os.path.join(run_dir, RECORD)
    else:
        err_name = "output.node-%d.log" % rank
        out_name = "events.node-%d.jsonl" % rank if spec.get("engine") else err_name
        record = os.path.join(run_dir, "node-%d.json" % rank)
    # the job's environment holds the profile's env (sbatch exported it); spec.json has the
    # secrets masked, so only the PYTHONPATH prepend is taken from it
    cmd_spec = dict(spec, argv=argv, env={})
    go_r, go_w = os.pipe()
    exec_r, exec_w = os.pipe()
    os.set_inheritable(exec_w, False)
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        os.close(exec_r)
        _command(cmd_spec, os.path.join(run_dir, out_name), os.path.join(run_dir, err_name),
                 go_r, exec_w)
    os.close(go_r)
    os.close(exec_w)

    def forward(sig: int, frame: Any) -> None:  # scancel --signal, time limit: to the group
        _signal_group(pid, sig)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    changes = {
        "status": "running", "pid": pid, "pgid": pid, "pid_start": proc_start(pid),
        "monitor_pid": os.getpid(), "monitor_start": proc_start(os.getpid()),
        "start": time.time(), "end": None, "exit_code": None, "node_rank": rank,
        "nnodes": nnodes, "job_id": job_id, "argv": argv, "rendezvous": endpoint,
        "node_host": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        "stdout": out_name, "stderr": err_name,
    }
    base = {k: spec.get(k) for k in ("id", "profile", "host", "run_dir", "scheduler",
                                     "engine", "cwd")}
    try:
        if rank == 0:
            rec = _update_record(run_dir, changes, dict(spec))
        else:
            rec = dict(base, **changes)
            write_json(record, rec)
    except OSError as e:  # unrecorded, it must not run: it dies before exec
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        sys.stderr.write("runner node: cannot record the run: %s\n" % (e.strerror or e))
        return 1
    os.write(go_w, b"g")
    os.close(go_w)
    with os.fdopen(exec_r, "rb") as f:
        exec_error = f.read().decode("utf-8", "replace")
    status = _reap_until(pid)
    code = exit_code(status)
    end: Dict[str, Any] = {"exit_code": code, "end": time.time()}
    if exec_error:
        end.update({"status": "failed", "error": exec_error})
        sys.stderr.write("runner node: %s\n" % exec_error)
    elif os.path.exists(os.path.join(run_dir, STOP_MARKER)):
        end["status"] = "stopped"
    else:
        end["status"] = "succeeded" if code == 0 else "failed"
    if rank == 0:
        _update_record(run_dir, end, rec)
    else:
        rec.update(end)
        write_json(record, rec)
    return code if code >= 0 else 128 - code


def _with_nodes(run_dir: str, rec: Dict[str, Any]) -> Dict[str, Any]:
    """A Slurm record with what its other nodes recorded (node-R.json), as "nodes"."""
    n = rec.get("nnodes")
    if not _is_int(n) or n <= 1:
        return rec
    nodes = []
    for rank in range(1, min(n, 4096)):
        other = read_json(os.path.join(run_dir, "node-%d.json" % rank))
        if other is None or record_problem(other) is not None:
            continue
        nodes.append({k: other.get(k) for k in ("node_rank", "status", "exit_code",
                                                "node_host", "start", "end")})
    return dict(rec, nodes=nodes)


SETTLE_KEYS = ("status", "reason", "slurm_state", "end")


def settle(run_dir: str, changes: Dict[str, Any]) -> Dict[str, Any]:
    """What the scheduler says of a Slurm job whose record did not say it (a job cancelled
    while pending, a node failure, a time limit): a `pending`/`running` record takes the new
    status; a finished one keeps its own and only gains the scheduler's state and reason."""
    run_dir = os.path.normpath(run_dir)
    try:
        rec, problem = load_record(run_dir)
    except FileNotFoundError:
        raise RunnerError("no run record at %s" % os.path.join(run_dir, RECORD)) from None
    if rec is None or not is_slurm(rec):
        raise RunnerError("run %s: not a Slurm record (%s)"
                          % (os.path.basename(run_dir), problem or "no job"))
    status = changes.get("status")
    if status is not None and status not in STATUSES:
        raise RunnerError("settle: %.40r is not a status" % (status,))
    with _RecordLock(run_dir):
        rec = read_json(os.path.join(run_dir, RECORD)) or rec
        new = {k: changes[k] for k in SETTLE_KEYS if k in changes}
        if rec.get("status") not in ("pending", "running"):
            # it recorded its own end meanwhile: keep that, learn only why the job ended
            # (end_reason: e.g. a time limit; none for a job that simply finished)
            new = {"slurm_state": changes.get("slurm_state")}
            if changes.get("end_reason") and not rec.get("reason"):
                new["reason"] = changes["end_reason"]
        elif "end" not in new:
            new["end"] = time.time()
        rec.update(new)
        if problem is None and record_problem(rec) is None:
            write_json(os.path.join(run_dir, RECORD), rec)
    return _with_nodes(run_dir, rec)


def mark_stop(run_dir: str) -> None:
    """The stop marker (before scancel): the nodes then record `stopped`, not `failed`."""
    fd = os.open(os.path.join(os.path.normpath(run_dir), STOP_MARKER),
                 os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("%f\n" % time.time())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def main(argv: List[str]) -> int:
    cmd = argv[1] if len(argv) > 1 else ""
    try:
        if cmd == "start" and len(argv) in (3, 4) and argv[3:] in ([], ["--unless-running"]):
            return start(argv[2], json.load(sys.stdin), unless_running=len(argv) == 4)
        if cmd == "list" and len(argv) in (3, 4):
            print(json.dumps(list_runs(argv[2], argv[3] if len(argv) == 4 else None)))
            return 0
        if cmd == "stop" and len(argv) == 4:
            print(json.dumps(stop(argv[2], float(argv[3]))))
            return 0
        if cmd == "submit" and len(argv) in (3, 4) and argv[3:] in ([], ["--unless-running"]):
            return submit(argv[2], json.load(sys.stdin), unless_running=len(argv) == 4)
        if cmd == "node" and len(argv) == 3:
            return node(argv[2])
        if cmd == "settle" and len(argv) == 3:
            print(json.dumps(settle(argv[2], json.load(sys.stdin))))
            return 0
        if cmd == "mark-stop" and len(argv) == 3:
            mark_stop(argv[2])
            print("{}")
            return 0
        if cmd == "freeport":
            print(free_port())
            return 0
    except RunnerError as e:
        print(json.dumps({"error": str(e)}))
        return 1
    except OSError as e:
        print(json.dumps({"error": "%s: %s" % (e.filename or cmd, e.strerror or e)}))
        return 1
    sys.stderr.write(__doc__ or "")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
