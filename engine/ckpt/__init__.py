"""Checkpoints on disk: drafter directories in every style (key map, config, checks, save,
convert), a target's heads and final norm read from its files, safetensors I/O, vocab maps."""
