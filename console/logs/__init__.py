"""Logs on a host: following a file by byte offset, the logs pane's model, and vLLM's log lines
and /metrics page parsed into figures."""
