"""Screens: the main screen (hosts + panes) and modal dialogs."""
