"""Helpers that run ON the host, with the host's own Python (standard library only).

`push` copies this package to ROOT/code/eagle3_hostside/ beside the engine. The console never
imports torch, and these files never import the console (or anything outside the stdlib), so
they run on any host Python >= 3.8.

    manifest.py  scan a tree into (size, mtime, sha256) per file, with gitignore-style excludes;
                 the console runs it through `python -c` (it is needed before anything is pushed)
    runner.py    start a detached run (own session and process group), record its exit, list
                 runs (marking lost ones) and stop them
"""
