"""Drafter checkpoints on a host: find, inspect and convert them, serve one in vLLM, and compare
served drafters by what vLLM measured."""
