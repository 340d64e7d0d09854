"""Training a drafter: typed settings, the set-up before the first step, the deterministic batch
plan, the TTT loop under torchrun, its checkpoints, and acceptance evaluation."""
