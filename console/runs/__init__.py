"""Runs as the console sees them: launch, list, find and stop (through a host's scheduler),
following one run's events and output, and building the demo workspace."""
