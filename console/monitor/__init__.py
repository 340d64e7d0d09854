"""GPU and host monitoring: the engine agent's samples as typed records, per-host streams, and
the nvidia-smi fallback for hosts that cannot run the agent yet."""
