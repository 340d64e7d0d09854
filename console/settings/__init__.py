"""What the console is told: the TOML config (hosts, syncs, profiles, theme), Slurm options and
metrics URLs as checked there, and safe writes of its own files."""
