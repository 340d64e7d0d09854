"""Tests of console/demo/: the embedded default a first start runs on."""
