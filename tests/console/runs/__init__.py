"""Tests of console/runs/: stopping, resuming and pruning runs."""
