"""Tests of engine/model/: the draft model, TTT attention and loss, packing."""
