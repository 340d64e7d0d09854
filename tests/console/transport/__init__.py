"""Tests of console/transport/: the local and SSH transports, host keys, ProxyJump, HTTP."""
