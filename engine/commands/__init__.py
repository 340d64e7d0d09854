"""One module per `python -m engine` command (see engine/cli.py for the contract)."""
