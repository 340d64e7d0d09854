"""The embedded demo: its config (config.py), the workspace build and its state (build.py)."""
