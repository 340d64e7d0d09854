"""Tests of engine/training/: train, resume, torchrun and evaluation."""
