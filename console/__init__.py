"""eagle3-console: the workstation half (Textual TUI + asyncssh). Never imports torch."""

__version__ = "0.1.0"
