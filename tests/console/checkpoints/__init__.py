"""Tests of console/checkpoints/: serve, swap, bench, compare and offline eval of drafters."""
