"""Detached runs on the host: start, list, stop (standard library only; runs on the host).

    python -m eagle3_hostside.runner start RUN_DIR < spec.json   prints {"pid", "pgid", ...}
    python -m eagle3_hostside.runner list RUNS_DIR [RUN_ID]      prints [record, ...]
    python -m eagle3_hostside.runner stop RUN_DIR GRACE_S        prints the final record
    python -m eagle3_hostside.runner freeport                    prints a free TCP port

`start` double-forks: the launcher forks a child that calls setsid() and forks the monitor, then
exits, so the monitor belongs to no SSH session and survives the connection. The monitor forks
the command, which calls setsid() again: the command leads its own session and process group
(what `stop` signals), apart from the monitor. The monitor writes run.json (atomically: temp
name, then rename) with the pid and group, waits for the command and records its exit code and
end time, whether or not any console is connected. Nothing but the monitor writes a record
while it lives; `list` reports `lost` for a record still `running` whose command and monitor
are both gone (a reboot, a killed monitor); `stop` finishes the record itself only when the
monitor is gone.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from typing import Any, Dict, List, Optional

RECORD = "run.json"
STOP_MARKER = "stop"
RUNNER_LOG = "runner.log"


# -- records -------------------------------------------------------------------------------------

def write_json(path: str, obj: Any) -> None:
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
        return obj if isinstance(obj, dict) else None
    except (OSError, ValueError):
        return None


def proc_start(pid: int) -> Optional[int]:
    """Start time of pid in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read().decode("ascii", "replace")
        return int(data[data.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: Optional[int], start: Optional[int] = None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if start is not None:
        now = proc_start(pid)
        return now is None or now == start
    return True


def group_alive(pgid: Optional[int]) -> bool:
    """Whether the process group has a member that is not a zombie (a dead process its parent
    has not reaped yet still counts for kill(2), but it is gone for us)."""
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


def effective(rec: Dict[str, Any]) -> Dict[str, Any]:
    """The record as it stands now: a `running` one whose processes are all gone is `lost`."""
    if rec.get("status") != "running":
        return rec
    if alive(rec.get("pid"), rec.get("pid_start")) or alive(rec.get("monitor_pid"),
                                                            rec.get("monitor_start")):
        return rec
    out = dict(rec)
    out["status"] = "lost"
    return out


# -- start ---------------------------------------------------------------------------------------

def start(run_dir: str, spec: Dict[str, Any]) -> int:
    """Start spec["argv"] detached (see the module docstring). Prints the record's pid part."""
    os.makedirs(run_dir)  # a run id is never reused
    write_json(os.path.join(run_dir, "spec.json"), spec)
    report_r, report_w = os.pipe()
    child = os.fork()
    if child == 0:  # first child: leave the SSH session, fork the monitor, vanish
        try:
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
        report = {"error": "the run monitor died before reporting"}
    print(json.dumps(report))
    return 1 if "error" in report else 0


def _monitor(run_dir: str, spec: Dict[str, Any], report_w: int) -> None:
    """The monitor: start the command, report, record its end. Never returns."""
    code = 1
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        devnull = os.open(os.devnull, os.O_RDWR)
        log = os.open(os.path.join(run_dir, RUNNER_LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                      0o644)
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
    exec_r, exec_w = os.pipe()  # closed by a successful exec (O_CLOEXEC), else carries the error
    os.set_inheritable(exec_w, False)
    pid = os.fork()
    if pid == 0:
        _command(spec, out_path, err_path, exec_w)
    os.close(exec_w)
    with os.fdopen(exec_r, "rb") as f:
        exec_error = f.read().decode("utf-8", "replace")
    rec: Dict[str, Any] = {k: v for k, v in spec.items() if k not in ("stdout", "stderr")}
    rec.update({
        "pid": pid, "pgid": pid, "pid_start": proc_start(pid),
        "monitor_pid": os.getpid(), "monitor_start": proc_start(os.getpid()),
        "start": time.time(), "status": "running", "exit_code": None, "end": None,
        "stdout": os.path.basename(out_path), "stderr": os.path.basename(err_path),
    })
    record = os.path.join(run_dir, RECORD)
    if exec_error:
        _, status = os.waitpid(pid, 0)
        rec.update({"status": "failed", "exit_code": exit_code(status), "end": time.time(),
                    "error": exec_error})
        write_json(record, rec)
        os.write(report_w, json.dumps({"error": exec_error}).encode())
        os.close(report_w)
        return 0
    write_json(record, rec)
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


def _command(spec: Dict[str, Any], out_path: str, err_path: str, exec_w: int) -> None:
    """In the forked command process: own session and group, redirect, exec. Never returns."""
    try:
        os.setsid()
        for sig in (signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        out = os.open(out_path, flags, 0o644)
        err = out if err_path == out_path else os.open(err_path, flags, 0o644)
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
    try:
        names = [run_id] if run_id else sorted(os.listdir(runs_dir))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        rec = read_json(os.path.join(runs_dir, name, RECORD))
        if rec is not None:
            out.append(effective(rec))
    return out


def stop(run_dir: str, grace: float) -> Dict[str, Any]:
    """SIGTERM the run's process group, SIGKILL what is left after grace seconds."""
    record = os.path.join(run_dir, RECORD)
    rec = read_json(record)
    if rec is None:
        raise SystemExit("no run record at %s" % record)
    if rec.get("status") != "running":
        return effective(rec)
    with open(os.path.join(run_dir, STOP_MARKER), "w") as f:
        f.write("%f\n" % time.time())
    pgid = rec.get("pgid")
    if pgid and alive(rec.get("pid"), rec.get("pid_start")) or group_alive(pgid):
        _signal_group(pgid, signal.SIGTERM)
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
        rec = read_json(record) or rec
        if rec.get("status") != "running":
            return rec
        if not alive(rec.get("monitor_pid"), rec.get("monitor_start")):
            break
        time.sleep(0.05)
    rec = read_json(record) or rec
    if rec.get("status") == "running":
        rec.update({"status": "stopped", "end": time.time()})
        write_json(record, rec)
    return rec


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def main(argv: List[str]) -> int:
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "start" and len(argv) == 3:
        return start(argv[2], json.load(sys.stdin))
    if cmd == "list" and len(argv) in (3, 4):
        print(json.dumps(list_runs(argv[2], argv[3] if len(argv) == 4 else None)))
        return 0
    if cmd == "stop" and len(argv) == 4:
        print(json.dumps(stop(argv[2], float(argv[3]))))
        return 0
    if cmd == "freeport":
        print(free_port())
        return 0
    sys.stderr.write(__doc__ or "")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
