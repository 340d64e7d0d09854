"""Tests of engine/capture/: features from vLLM and the capture's reference check."""
