"""Streamed training data through a Mooncake store: the master we own, the store client, the
sample codec, the bounded pool, the producer and the trainer's reader (docs/stream.md)."""
