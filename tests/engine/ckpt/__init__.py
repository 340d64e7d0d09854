"""Tests of engine/ckpt/: convert, inspect, config styles, key maps, vocab and target weights."""
