"""The screens the app shows: the main screen (hosts + panes) and an opened run."""
