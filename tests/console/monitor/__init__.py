"""Tests of console/monitor/: the GPU monitor service and the nvidia-smi fallback."""
