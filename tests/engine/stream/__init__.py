"""Tests of engine/stream/: the Mooncake store, its master, the pool and streamed training."""
