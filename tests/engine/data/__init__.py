"""Tests of engine/data/: prepare, regen and the data readers."""
