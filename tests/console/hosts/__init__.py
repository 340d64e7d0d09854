"""Tests of console/hosts/: push, doctor and the host pool."""
