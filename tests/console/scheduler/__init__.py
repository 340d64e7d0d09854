"""Tests of console/scheduler/: detached runs over ssh, Slurm and several nodes."""
