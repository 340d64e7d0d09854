"""Tests of console/logs/: following logs, vLLM's log lines and its /metrics."""
