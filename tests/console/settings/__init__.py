"""Tests of console/settings/: the config file."""
