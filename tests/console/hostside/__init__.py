"""Tests of console/hostside/: the scripts the console runs on a host (the runner, run records)."""
