"""Tests of the whole project: the import contracts, the tree and file map, packaging, and
flows end to end through both halves."""
