"""Tests of console/screens/: run detail."""
