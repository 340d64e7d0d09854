"""Tests of console/panes/: each pane driven with Pilot, and its snapshots."""
