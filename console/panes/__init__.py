"""Panes: one per tab of the main screen. Each renders the selected host's state and starts
workers that call services (console/hosts/host.py and friends); none does I/O itself."""
