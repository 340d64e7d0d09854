"""The EAGLE-3 draft network and its math: the config, one decoder layer over fused target
features, TTT attention and the training objective."""
