"""The modal dialogs a pane or the app opens over the main screen: a yes/no question, the
convert, serve and evaluate forms, the comparison table and help."""
