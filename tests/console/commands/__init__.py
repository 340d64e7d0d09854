"""Tests of console/commands/: subcommands as a script or a person reads them."""
