"""One module per `eagle3-console` subcommand (see console/cli.py for the contract)."""
