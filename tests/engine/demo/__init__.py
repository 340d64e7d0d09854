"""Tests of engine/demo/: the demo workspace."""
