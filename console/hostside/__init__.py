"""Helpers that run ON the host, with the host's own Python (standard library only).

`push` copies this package to ROOT/code/eagle3_hostside/ beside the engine (the whole folder:
every file here goes). The console never imports torch, and these files never import the
console (or anything outside the stdlib), so they run on any host Python >= 3.8.

    manifest.py         scan a tree into (size, mtime, sha256) per file, with gitignore-style
                        excludes; the console runs it through `python -c` (it is needed before
                        anything is pushed)
    runner.py           the one script the console runs for runs (`python -B runner.py CMD`):
                        start a detached run (own session and process group), record its exit,
                        list runs (marking lost ones) and stop them; the Slurm commands go to
    slurm_job.py        Slurm runs: sbatch a batch script (submit), run and record one node of
                        the job under srun (node), take the scheduler's word (settle, mark-stop)
    records.py          what both share: run.json written and checked field by field
                        (record_problem), listing, pid/start-time identity, the profile lock and
                        the forked command's side of a start. As a script, runner.py compiles
                        these two siblings from source (no bytecode cache is ever read)
    checkpoint_scan.py  find checkpoint folders under the given roots; the console runs its
                        source through `python -c` (console/checkpoints/service.py)
    nvidia_smi_fallback.sh  the monitor fallback's shell round trip, a template that
                        console/monitor/nvidia_smi.py fills (package data, not a module)
"""
