"""Tests of the server half, engine/ (python -m engine and its library)."""
