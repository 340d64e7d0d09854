"""The offline demo: a tiny synthetic target and a complete workspace built from it."""
