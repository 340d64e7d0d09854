"""Slurm runs on the host: submit, node, settle, mark-stop (standard library only; runs on the
host, through runner.py, the one script the console runs: see its docstring for the commands).

A record with "scheduler": "slurm": `submit` (on the login node, under the profile lock of
`start`) writes the batch script job.sh and a `pending` run.json, then runs `sbatch --parsable`
(the profile's env, secrets included, reaches the job through sbatch's environment, never our
files) and records the job id. The script runs `srun ... runner.py node RUN_DIR`: one `node`
per allocated node, in the foreground (srun tracks it), starts the command like the monitor of
`start` does (own session and group, recorded before it runs) with SLURM_NODEID as the node
rank and the first node of the allocation as the rendezvous, forwards SIGTERM (scancel
--signal, time limit) to the command's group and records the exit: node 0 in run.json, node R
in node-R.json, its output in output.node-R.log. `settle` records what the scheduler says of a
job whose record did not say it; `mark-stop` leaves the stop marker before a scancel. run.json
is read-modified-written under the lock file .record.lock in the run directory (the login node
and node 0 both write it).
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

if __package__:  # console.hostside.slurm_job (the console), eagle3_hostside.slurm_job
    from . import records
else:  # compiled from source by runner.py run as a script, which loaded records first
    records = sys.modules["records"]

JOB_SCRIPT = "job.sh"
RECORD_LOCK = ".record.lock"
SBATCH_TIMEOUT = 120
SETTLE_KEYS = ("status", "reason", "slurm_state", "end")


# -- the record and the submission ---------------------------------------------------------------

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
    path = os.path.join(run_dir, records.RECORD)
    with _RecordLock(run_dir):
        rec = records.read_json(path) or dict(base or {})
        rec.update(changes)
        records.write_json(path, rec)
    return rec


def submit(run_dir: str, spec: Dict[str, Any], unless_running: bool = False) -> int:
    """sbatch the batch script in spec["script"] (see the module docstring); prints
    {"job_id": ...}, or {"error": ...} with exit status 1 and nothing left behind."""
    return records.answer("submit", run_dir,
                          lambda: _submit(os.path.normpath(run_dir), spec, unless_running))


def _submit(run_dir: str, spec: Dict[str, Any], unless_running: bool) -> Dict[str, Any]:
    runs_dir = os.path.dirname(run_dir)
    if not os.path.isdir(runs_dir):
        os.makedirs(runs_dir, 0o700)
    profile = str(spec.get("profile") or "")
    lock = records.lock_profile(os.path.dirname(runs_dir), profile)
    try:
        if unless_running:
            busy = [r["id"] for r in records.list_runs(runs_dir) if r.get("profile") == profile
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
    rec["env"] = records.masked(spec.get("env"))
    records.write_json(os.path.join(run_dir, records.SPEC), rec)
    job_path = os.path.join(run_dir, JOB_SCRIPT)
    fd = os.open(job_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(str(spec.get("script") or ""))
    rec.update({"status": "pending", "job_id": None, "submitted": time.time(), "start": None,
                "end": None, "exit_code": None})
    records.write_json(os.path.join(run_dir, records.RECORD), rec)
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
    for name in (records.SPEC, JOB_SCRIPT, records.RECORD, RECORD_LOCK):
        try:
            os.unlink(os.path.join(run_dir, name))
        except OSError:
            pass
    records.remove_unrecorded(run_dir)


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


# -- one node of the job -------------------------------------------------------------------------

class _Node(NamedTuple):
    """What one node of the job runs, and where it records it."""

    rank: int
    nnodes: int
    job_id: Optional[str]
    endpoint: str                # the rendezvous, host:port
    argv: List[Any]
    out_name: str
    err_name: str
    record: str                  # run.json for node 0, node-R.json for the others


def node(run_dir: str) -> int:
    """One node of a Slurm job (under srun): run the command in the foreground, record it.
    Exits with the command's status, so srun (--kill-on-bad-exit) and the job's state see it."""
    run_dir = os.path.normpath(run_dir)
    spec = records.read_json(os.path.join(run_dir, records.SPEC))
    if spec is None or not isinstance(spec.get("argv"), list):
        sys.stderr.write("runner node: no readable %s in %s\n" % (records.SPEC, run_dir))
        return 2
    plan = _plan(run_dir, spec)
    pid, go_w, exec_r = _fork_command(run_dir, spec, plan)
    _forward_signals(pid)
    try:
        rec = _record_start(run_dir, spec, plan, pid)
    except OSError as e:  # unrecorded, it must not run: it dies before exec
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        sys.stderr.write("runner node: cannot record the run: %s\n" % (e.strerror or e))
        return 1
    os.write(go_w, b"g")
    os.close(go_w)
    with os.fdopen(exec_r, "rb") as f:
        exec_error = f.read().decode("utf-8", "replace")
    code = records.exit_code(records.reap_until(pid))
    _record_end(run_dir, plan, rec, code, exec_error)
    return code if code >= 0 else 128 - code


def _plan(run_dir: str, spec: Dict[str, Any]) -> _Node:
    """This node's rank, rendezvous, command line and file names (from spec.json and the
    SLURM_* variables srun sets)."""
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
        record = os.path.join(run_dir, records.RECORD)
    else:
        err_name = "output.node-%d.log" % rank
        out_name = "events.node-%d.jsonl" % rank if spec.get("engine") else err_name
        record = os.path.join(run_dir, "node-%d.json" % rank)
    return _Node(rank, nnodes, job_id, endpoint, argv, out_name, err_name, record)


def _fork_command(run_dir: str, spec: Dict[str, Any], plan: _Node) -> Tuple[int, int, int]:
    """Fork the command (it waits for "g" on the go pipe); (pid, go_w, exec_r)."""
    # the job's environment holds the profile's env (sbatch exported it); spec.json has the
    # secrets masked, so only the PYTHONPATH prepend is taken from it
    cmd_spec = dict(spec, argv=plan.argv, env={})
    go_r, go_w = os.pipe()
    exec_r, exec_w = os.pipe()
    os.set_inheritable(exec_w, False)
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        os.close(exec_r)
        records.run_command(cmd_spec, os.path.join(run_dir, plan.out_name),
                            os.path.join(run_dir, plan.err_name), go_r, exec_w)
    os.close(go_r)
    os.close(exec_w)
    return pid, go_w, exec_r


def _forward_signals(pgid: int) -> None:
    def forward(sig: int, frame: Any) -> None:  # scancel --signal, time limit: to the group
        records.signal_group(pgid, sig)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)


def _record_start(run_dir: str, spec: Dict[str, Any], plan: _Node, pid: int) -> Dict[str, Any]:
    """Record the started command (node 0 in run.json, node R in node-R.json); the record."""
    changes = {
        "status": "running", "pid": pid, "pgid": pid, "pid_start": records.proc_start(pid),
        "monitor_pid": os.getpid(), "monitor_start": records.proc_start(os.getpid()),
        "start": time.time(), "end": None, "exit_code": None, "node_rank": plan.rank,
        "nnodes": plan.nnodes, "job_id": plan.job_id, "argv": plan.argv,
        "rendezvous": plan.endpoint,
        "node_host": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        "stdout": plan.out_name, "stderr": plan.err_name,
    }
    if plan.rank == 0:
        return _update_record(run_dir, changes, dict(spec))
    base = {k: spec.get(k) for k in ("id", "profile", "host", "run_dir", "scheduler",
                                     "engine", "cwd")}
    rec = dict(base, **changes)
    records.write_json(plan.record, rec)
    return rec


def _record_end(run_dir: str, plan: _Node, rec: Dict[str, Any], code: int,
                exec_error: str) -> None:
    """Record how the command ended: `failed` when it could not be run, `stopped` after a
    mark-stop, else by its exit code."""
    end: Dict[str, Any] = {"exit_code": code, "end": time.time()}
    if exec_error:
        end.update({"status": "failed", "error": exec_error})
        sys.stderr.write("runner node: %s\n" % exec_error)
    elif os.path.exists(os.path.join(run_dir, records.STOP_MARKER)):
        end["status"] = "stopped"
    else:
        end["status"] = "succeeded" if code == 0 else "failed"
    if plan.rank == 0:
        _update_record(run_dir, end, rec)
    else:
        rec.update(end)
        records.write_json(plan.record, rec)


# -- what the scheduler says ---------------------------------------------------------------------

def settle(run_dir: str, changes: Dict[str, Any]) -> Dict[str, Any]:
    """What the scheduler says of a Slurm job whose record did not say it (a job cancelled
    while pending, a node failure, a time limit): a `pending`/`running` record takes the new
    status; a finished one keeps its own and only gains the scheduler's state and reason."""
    run_dir = os.path.normpath(run_dir)
    try:
        rec, problem = records.load_record(run_dir)
    except FileNotFoundError:
        raise records.RunnerError("no run record at %s"
                                  % os.path.join(run_dir, records.RECORD)) from None
    if rec is None or not records.is_slurm(rec):
        raise records.RunnerError("run %s: not a Slurm record (%s)"
                                  % (os.path.basename(run_dir), problem or "no job"))
    status = changes.get("status")
    if status is not None and status not in records.STATUSES:
        raise records.RunnerError("settle: %.40r is not a status" % (status,))
    with _RecordLock(run_dir):
        rec = records.read_json(os.path.join(run_dir, records.RECORD)) or rec
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
        if problem is None and records.record_problem(rec) is None:
            records.write_json(os.path.join(run_dir, records.RECORD), rec)
    return records.with_nodes(run_dir, rec)


def mark_stop(run_dir: str) -> None:
    """The stop marker (before scancel): the nodes then record `stopped`, not `failed`."""
    fd = os.open(os.path.join(os.path.normpath(run_dir), records.STOP_MARKER),
                 os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("%f\n" % time.time())
