"""Detached runs on the host: start, list, stop, prune (standard library only; on the host).

    python -B runner.py start RUN_DIR [--unless-running] [--resume] < spec.json  prints {"pid"}
    python -B runner.py list RUNS_DIR [RUN_ID]                         prints [record, ...]
    python -B runner.py stop RUN_DIR GRACE_S                           prints the final record
    python -B runner.py prune RUNS_DIR                                 forgets ended runs (ours)
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
`start --resume` starts an ended run (stopped, failed, lost) again in its own directory, under
the same id: its record is replaced by the new attempt's (the earlier ones kept as "attempts"),
its logs are appended to, a stop marker left from before is removed. Nothing but the monitor
writes a record while it lives; `list` reports `lost` for a record
still `running` whose command and monitor are both gone (a reboot, a killed monitor), and
`corrupt` (with the reason) for a record it cannot trust; `stop` finishes the record itself
only when the monitor is gone. The command gets its run directory in EAGLE3_RUN_DIR: while a
cleanup must not be cut it writes a hold there (stop-hold.json, engine/stop_hold.py) and `stop`
waits for it past the grace before SIGKILL.

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

# (the docstring above is the usage text a bad command line prints.) This file is the one
# script the console runs, for every subcommand; the Slurm ones (submit, node, settle,
# mark-stop) are in slurm_job.py, the records and the process plumbing both share in
# records.py. As a script (sys.path[0] is this folder) it compiles those two from their
# source, as Python does this file, so a truncated bytecode cache cannot break them either.

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import sys
import time
import types
from typing import Any, Dict, List, Optional, Tuple


def _load_sibling(name: str) -> Any:
    """NAME.py beside this script, compiled from its source into sys.modules[NAME] (never read
    from __pycache__, which a full disk may have left truncated: see the docstring)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
    module = types.ModuleType(name)
    module.__file__ = path
    sys.modules[name] = module
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    exec(code, module.__dict__)
    return module


if __package__:  # imported: console.hostside.runner (the console), eagle3_hostside.runner
    from . import records, slurm_job
else:  # run as a script: slurm_job finds records in sys.modules, so it loads first
    records = _load_sibling("records")
    slurm_job = _load_sibling("slurm_job")

record_problem = records.record_problem   # the console checks the records it reads with it
proc_start = records.proc_start

#: a command may hold SIGKILL off while a cleanup must not be cut (engine/stop_hold.py writes
#: RUN_DIR/HOLD_FILE: {"until": unix time, "after_term_s": seconds past the SIGTERM, "why",
#: "left"}); `stop` waits at most HOLD_MAX_S past the grace
HOLD_ENV = "EAGLE3_RUN_DIR"
HOLD_FILE = "stop-hold.json"
HOLD_MAX_S = 3600.0
HOLD_MAX_BYTES = 1 << 16


# -- start ---------------------------------------------------------------------------------------

def start(run_dir: str, spec: Dict[str, Any], unless_running: bool = False,
          resume: bool = False) -> int:
    """Start spec["argv"] detached (see the module docstring). Prints the record's pid part,
    or {"error": ...} with exit status 1 when the run did not start."""
    return records.answer("start", run_dir,
                          lambda: _start(run_dir, spec, unless_running, resume))


def _again(run_dir: str, spec: Dict[str, Any]) -> Dict[str, Any]:
    """spec for another attempt of the ended run in run_dir (RunnerError when it cannot be
    started again): the earlier attempts go with it, the stop marker of the last one goes."""
    try:
        rec, problem = records.load_record(run_dir)
    except FileNotFoundError:
        raise records.RunnerError("no run record at %s: nothing to resume"
                                  % os.path.join(run_dir, records.RECORD)) from None
    if rec is None:
        raise records.RunnerError("the record of run %s is corrupt (%s); not started again"
                                  % (os.path.basename(run_dir), problem))
    status = records.effective(rec)["status"]
    if status not in ("stopped", "failed", "lost"):
        raise records.RunnerError("run %s is %s: only a stopped, failed or lost run is started "
                                  "again" % (rec["id"], status))
    attempts = [a for a in rec.get("attempts") or [] if isinstance(a, dict)]
    attempts.append(dict({k: rec.get(k) for k in ("start", "end", "exit_code", "argv")},
                         status=status))
    for name in (records.STOP_MARKER, HOLD_FILE):
        try:
            os.unlink(os.path.join(run_dir, name))
        except FileNotFoundError:
            pass
    return dict(spec, attempts=attempts)


def _start(run_dir: str, spec: Dict[str, Any], unless_running: bool,
           resume: bool = False) -> Dict[str, Any]:
    run_dir = os.path.normpath(run_dir)
    runs_dir = os.path.dirname(run_dir)
    if not os.path.isdir(runs_dir):
        os.makedirs(runs_dir, 0o700)
    profile = str(spec.get("profile") or "")
    lock = records.lock_profile(os.path.dirname(runs_dir), profile)
    try:  # held until the new run is recorded (or refused): one start per profile at a time
        if unless_running:
            busy = [r["id"] for r in records.list_runs(runs_dir)
                    if r.get("profile") == profile and r.get("status") == "running"]
            if busy:
                return {"error": "profile %r is already running (%s); stop it or launch with "
                                 "--force" % (profile, ", ".join(busy))}
        if resume:  # the same run again: its directory (and out/) are kept
            spec = _again(run_dir, spec)
        else:
            os.mkdir(run_dir, 0o700)  # a run id is never reused for another run
        os.chmod(run_dir, 0o700)  # whatever the umask: records may name private paths
        try:
            records.write_json(os.path.join(run_dir, records.SPEC),
                               dict(spec, env=records.masked(spec.get("env"))))
            report = _fork_monitor(run_dir, spec, lock)
        except BaseException:
            records.remove_unrecorded(run_dir)
            raise
        if "error" in report:
            records.remove_unrecorded(run_dir)
        return report
    finally:
        os.close(lock)


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
        log = os.open(os.path.join(run_dir, records.RUNNER_LOG),
                      os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
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
        os.environ[HOLD_ENV] = os.path.abspath(run_dir)  # where the command may ask for time
        records.run_command(spec, out_path, err_path, go_r, exec_w)
    os.close(go_r)
    os.close(exec_w)
    rec: Dict[str, Any] = {k: v for k, v in spec.items() if k not in ("stdout", "stderr")}
    rec.update({
        "env": records.masked(spec.get("env")),
        "pid": pid, "pgid": pid, "pid_start": records.proc_start(pid),
        "monitor_pid": os.getpid(), "monitor_start": records.proc_start(os.getpid()),
        "start": time.time(), "status": "running", "exit_code": None, "end": None,
        "stdout": os.path.basename(out_path), "stderr": os.path.basename(err_path),
    })
    record = os.path.join(run_dir, records.RECORD)
    try:
        records.write_json(record, rec)
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
        rec.update({"status": "failed", "exit_code": records.exit_code(status),
                    "end": time.time(), "error": exec_error})
        records.write_json(record, rec)
        os.write(report_w, json.dumps({"error": exec_error}).encode())
        os.close(report_w)
        return 0
    os.write(report_w, json.dumps({"pid": pid, "pgid": pid, "start": rec["start"]}).encode())
    os.close(report_w)
    status = records.reap_until(pid)
    rec["exit_code"] = records.exit_code(status)
    rec["end"] = time.time()
    if os.path.exists(os.path.join(run_dir, records.STOP_MARKER)):
        rec["status"] = "stopped"
    else:
        rec["status"] = "succeeded" if rec["exit_code"] == 0 else "failed"
    records.write_json(record, rec)
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
        if not records.group_alive(pgid):
            return
        time.sleep(0.05)


# -- list / stop ---------------------------------------------------------------------------------

def _reread(run_dir: str, rec: Dict[str, Any]) -> Dict[str, Any]:
    try:
        new, _ = records.load_record(run_dir)
    except FileNotFoundError:
        new = None
    return new if new is not None else rec


def stop(run_dir: str, grace: float) -> Dict[str, Any]:
    """SIGTERM the run's process group, SIGKILL what is left after grace seconds, or once the
    command's hold has passed (HOLD_FILE: a cleanup that must not be cut, such as a drafter
    swapped back into a serving vLLM; at most HOLD_MAX_S). The answer says what the stop
    waited for (stop_held) and what the command left undone (stop_warning).

    Only a group whose leader is still our command (pid and start time as recorded) is
    signalled: a run whose command and monitor are gone comes back `lost` with "refused"
    saying why, and nothing is signalled or written."""
    try:
        rec, problem = records.load_record(run_dir)
    except FileNotFoundError:
        raise records.RunnerError("no run record at %s"
                                  % os.path.join(run_dir, records.RECORD)) from None
    if rec is None:
        raise records.RunnerError("the record of run %s is corrupt (%s); nothing was signalled"
                                  % (os.path.basename(os.path.normpath(run_dir)), problem))
    if records.is_slurm(rec):
        raise records.RunnerError("run %s is Slurm job %s: it is stopped with scancel, not "
                                  "signalled from the login node"
                                  % (rec["id"], rec.get("job_id")))
    if rec["status"] != "running":
        return records.effective(rec)
    pgid = rec["pgid"]
    # the command leads its own group (pgid == pid); while that process lives with the
    # recorded start time, its group id cannot belong to anyone else
    leader = pgid == rec["pid"] and records.ours(rec["pid"], rec.get("pid_start"))
    monitor = records.ours(rec.get("monitor_pid"), rec.get("monitor_start"))
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
        return records.effective(rec)
    fd = os.open(os.path.join(run_dir, records.STOP_MARKER),
                 os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("%f\n" % time.time())
    termed = time.time()
    records.signal_group(pgid, signal.SIGTERM)
    # from here on the group is the one we verified: its id stays taken while it has members
    deadline = time.time() + grace
    while records.group_alive(pgid) and time.time() < deadline:
        time.sleep(0.05)
    held, held_s = _wait_for_hold(run_dir, pgid, termed)
    if records.group_alive(pgid):
        records.signal_group(pgid, signal.SIGKILL)
        deadline = time.time() + 5
        while records.group_alive(pgid) and time.time() < deadline:
            time.sleep(0.05)
    return _with_hold(_recorded_end(run_dir, rec), run_dir, held, held_s)


def _recorded_end(run_dir: str, rec: Dict[str, Any]) -> Dict[str, Any]:
    """The record once the command is gone: the monitor's, or (the monitor gone too) ours."""
    deadline = time.time() + 5
    while time.time() < deadline:
        rec = _reread(run_dir, rec)
        if rec.get("status") != "running":
            return rec
        if not records.ours(rec.get("monitor_pid"), rec.get("monitor_start")):
            break
        time.sleep(0.05)
    rec = _reread(run_dir, rec)
    if rec.get("status") == "running":
        rec.update({"status": "stopped", "end": time.time()})
        records.write_json(os.path.join(run_dir, records.RECORD), rec)
    return rec


def _read_hold(run_dir: str) -> Optional[Dict[str, Any]]:
    """The command's hold (HOLD_FILE), checked: None when absent or not one."""
    try:
        fd = os.open(os.path.join(run_dir, HOLD_FILE),
                     os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, HOLD_MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        doc = json.loads(data.decode("utf-8")) if len(data) <= HOLD_MAX_BYTES else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    until, after = doc.get("until", 0), doc.get("after_term_s", 0)
    if not (_finite(until) and _finite(after)):
        return None
    return {"until": float(until), "after_term_s": float(after), "why": _line(doc.get("why")),
            "left": _line(doc.get("left"))}


def _finite(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and abs(v) < 1e300


def _line(v: Any) -> str:
    return " ".join(v.split())[:2000] if isinstance(v, str) else ""


def _wait_for_hold(run_dir: str, pgid: int, termed: float) -> Tuple[str, float]:
    """After the grace: while the command asks for time (its hold), wait for it, at most
    HOLD_MAX_S; what it was doing ("" if nothing) and the seconds waited."""
    start = time.time()
    why = ""
    while records.group_alive(pgid) and time.time() < start + HOLD_MAX_S:
        hold = _read_hold(run_dir)
        if hold is None or max(hold["until"], termed + hold["after_term_s"]) <= time.time():
            break
        why = hold["why"] or why
        time.sleep(0.1)
    return why, time.time() - start


def _with_hold(rec: Dict[str, Any], run_dir: str, held: str, held_s: float) -> Dict[str, Any]:
    """The stop's answer: the record, what the stop waited for (stop_held) and what the
    command left undone (stop_warning: its hold's `left`, when the hold is still there)."""
    out = dict(rec)
    if held:
        out["stop_held"] = "%s (waited %.0f s)" % (held, held_s)
    hold = _read_hold(run_dir)
    if hold is not None and hold["left"]:
        out["stop_warning"] = hold["left"]
    try:  # said once, by this answer
        os.unlink(os.path.join(run_dir, HOLD_FILE))
    except OSError:
        pass
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def main(argv: List[str]) -> int:
    cmd = argv[1] if len(argv) > 1 else ""
    try:
        if cmd == "start" and len(argv) >= 3 and \
                set(argv[3:]) <= {"--unless-running", "--resume"}:
            return start(argv[2], json.load(sys.stdin),
                         unless_running="--unless-running" in argv[3:],
                         resume="--resume" in argv[3:])
        if cmd == "list" and len(argv) in (3, 4):
            print(json.dumps(records.list_runs(argv[2], argv[3] if len(argv) == 4 else None)))
            return 0
        if cmd == "prune" and len(argv) == 3:
            print(json.dumps(records.prune_runs(argv[2])))
            return 0
        if cmd == "stop" and len(argv) == 4:
            print(json.dumps(stop(argv[2], float(argv[3]))))
            return 0
        if cmd == "submit" and len(argv) in (3, 4) and argv[3:] in ([], ["--unless-running"]):
            return slurm_job.submit(argv[2], json.load(sys.stdin), unless_running=len(argv) == 4)
        if cmd == "node" and len(argv) == 3:
            return slurm_job.node(argv[2])
        if cmd == "settle" and len(argv) == 3:
            print(json.dumps(slurm_job.settle(argv[2], json.load(sys.stdin))))
            return 0
        if cmd == "mark-stop" and len(argv) == 3:
            slurm_job.mark_stop(argv[2])
            print("{}")
            return 0
        if cmd == "freeport":
            print(free_port())
            return 0
    except records.RunnerError as e:
        print(json.dumps({"error": str(e)}))
        return 1
    except OSError as e:
        print(json.dumps({"error": "%s: %s" % (e.filename or cmd, e.strerror or e)}))
        return 1
    sys.stderr.write(__doc__ or "")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
