"""Reusable widgets: they render state and post messages; they never do I/O."""
