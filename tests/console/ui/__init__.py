"""Tests of console/ui/: the key map and the themes."""
