"""What the TUI's screens, panes and widgets share: the key map, messages, the command palette,
themes and the typed view of the app's services."""
