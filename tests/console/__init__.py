"""Tests of the workstation half, console/ (the app, its panes and subcommands, the transports)."""
